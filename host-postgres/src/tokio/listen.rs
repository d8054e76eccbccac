//! The async store's listener: a task with a connection of its own that `LISTEN`s on the channel
//! the store's hints notify, counting what it hears into a [`Wakeups`] (the synchronous listener's
//! count), reconnecting with a growing pause when the connection is lost (a restart, a failover
//! through a multi-host URL).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Config, Socket};

use crate::notifier::NOTIFY_CHANNEL;
use crate::wakeup::{State, LISTEN_TICK, MAX_RECONNECT_PAUSE};

/// Listens until `state` says stop: each notification, and each reconnection (what was notified
/// while the connection was down is lost), moves the count.
pub(crate) async fn listen_until_stopped<T>(config: Config, tls: T, state: Arc<State>)
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let mut failures: u32 = 0;
    while !state.stop.load(Ordering::SeqCst) {
        if listen_once(&config, tls.clone(), &state).await {
            failures = 0;
        } else {
            failures = failures.saturating_add(1);
        }
        state.listening.store(false, Ordering::SeqCst);
        state.generation.fetch_add(1, Ordering::SeqCst);
        let pause = (LISTEN_TICK * 2u32.saturating_pow(failures.min(10))).min(MAX_RECONNECT_PAUSE);
        tokio::time::sleep(pause).await;
    }
}

/// One connection's life: connects, `LISTEN`s, counts until the connection ends or the listener
/// is told to stop. Whether it got as far as listening.
async fn listen_once<T>(config: &Config, tls: T, state: &State) -> bool
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let Ok((client, mut connection)) = config.connect(tls).await else {
        return false;
    };
    let sql = format!("LISTEN {NOTIFY_CHANNEL}");
    let listen = client.batch_execute(&sql);
    tokio::pin!(listen);
    // The `LISTEN` is answered only while the connection is polled.
    loop {
        tokio::select! {
            listened = &mut listen => match listened {
                Ok(()) => break,
                Err(_) => return false,
            },
            message = std::future::poll_fn(|cx| connection.poll_message(cx)) => match message {
                Some(Ok(_)) => {}
                _ => return false,
            },
        }
    }
    state.listening.store(true, Ordering::SeqCst);
    state.generation.fetch_add(1, Ordering::SeqCst);
    while !state.stop.load(Ordering::SeqCst) {
        let heard = tokio::time::timeout(
            LISTEN_TICK,
            std::future::poll_fn(|cx| connection.poll_message(cx)),
        )
        .await;
        match heard {
            Err(_) => {}
            Ok(Some(Ok(AsyncMessage::Notification(_)))) => {
                state.generation.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_)) | None) => return true,
        }
    }
    true
}
