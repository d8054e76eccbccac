//! The store's writes as work for the writer thread ([`crate::Writer::submit`]): what
//! [`SqliteStore`]'s methods run in the writer's transaction, for the async store
//! (`crate::tokio`) to submit as well. One body per write, so both write the same row changes.

use super::*;

/// Leases up to `request.limit` claimable commands (see [`Outbox::claim`]).
pub(crate) fn claim(
    tx: &Connection,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<Delivery>, Error> {
    request.validate()?;
    claim_in(tx, request, now)
}

/// Completes each ack (see [`Outbox::complete_all`]): one result per ack.
pub(crate) fn complete_all(
    tx: &Connection,
    acks: &[Ack],
    now: Timestamp,
) -> Result<Vec<Result<(), Error>>, Error> {
    complete_each(tx, acks, now)
}

/// The acks, then the next claim in a savepoint (see [`Outbox::complete_all_and_claim`]): a claim
/// that fails is rolled back alone and reported in [`Handover::claimed`].
pub(crate) fn complete_all_and_claim(
    tx: &Connection,
    acks: &[Ack],
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Handover, Error> {
    let completed = complete_each(tx, acks, now)?;
    let claimed = request
        .validate()
        .and_then(|()| in_savepoint(tx, |conn| claim_in(conn, request, now)));
    Ok(Handover { completed, claimed })
}

/// Applies `change` (one of [`OutboxRow`]'s rules) to one row and writes what it changed.
pub(crate) fn update<T>(
    tx: &Connection,
    command_id: &CommandId,
    now: Timestamp,
    change: impl FnOnce(&mut OutboxRow) -> Result<T, Error>,
) -> Result<T, Error> {
    let row = select_row(tx, command_id)?.ok_or_else(|| Error::UnknownCommand {
        command_id: command_id.clone(),
    })?;
    let changed = row.into_change(now, change)?;
    write_change(tx, &changed)?;
    Ok(changed.value)
}

/// Takes up to `limit` due timers for `lease_ttl` (see [`Timers::claim_timers`]).
pub(crate) fn claim_timers(
    tx: &Connection,
    limit: usize,
    lease_ttl: Duration,
    now: Timestamp,
) -> Result<Vec<TimerRow>, Error> {
    claim_timers_in(tx, limit, lease_ttl, now)
}
