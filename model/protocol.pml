/*
 * miniflow's delivery protocol: outbox leases with fencing tokens (DESIGN rules 7-9) and a receiver
 * that folds duplicates with fenced reservations (rules 10 and 14).
 *
 * Checked in every interleaving:
 *   - a key's effect never happens twice;
 *   - a command becomes done only when its effect has happened, exactly once;
 *   - a done or dead command stays so, and the current lease holder finds its command as it left
 *     it: no late or stale ack or failure changes anything;
 *   - when nothing can move any more, every command is done with exactly one effect, or dead with
 *     at most one: none is lost.
 *
 * Variants, chosen when the model is compiled (spin -a -D...):
 *   (none)                  fenced reservations; the receiver commits its effect in the same atomic
 *                           step as finish, under the token check (rule 14's at-most-once receiver).
 *   -DEFFECT_BEFORE_FINISH  the receiver does its effect in a step of its own, then finishes. It keeps
 *                           its reservation timeout above its slowest effect: a holder that goes for
 *                           the effect neither times out nor crashes before it has finished. A holder
 *                           that abandons may be slow, time out, and abandon late.
 *   -DUNFENCED              reservations without tokens: finish and abandon act on whatever
 *                           reservation the key has, and abandon deletes it.
 *   -DSLOW_EFFECT           with EFFECT_BEFORE_FINISH: a reservation may time out while its holder is
 *                           on its way to the effect (an effect slower than the timeout).
 *   -DACK_WITHOUT_RESULT    a worker may complete a command without a verifiable result (takes a
 *                           lost answer or an InProgress for success), against rule 8.
 * scripts/check-model checks that the first two hold, and that UNFENCED and SLOW_EFFECT (each with
 * EFFECT_BEFORE_FINISH) and ACK_WITHOUT_RESULT fail for the reason they name (see README.md).
 *
 * Replay a trail with the same -D flags: `spin -t -D... protocol.pml` prints what happened, one line
 * per step, naming each delivery by its command and lease token (c1/t2: command 1, token 2).
 */

#define NC 2                /* commands (the claim step names both); a command's ID is also its
                               idempotency key at the receiver */
#define NW 3                /* workers (System runs a step for each) */
#ifndef MAX_ATTEMPTS
#define MAX_ATTEMPTS 3      /* claims of a command before an expired lease makes it dead (at most 15) */
#endif

/* outbox row status */
#define PENDING   0
#define LEASED    1
#define DONE      2
#define DEAD      3

/* receiver record state */
#define ABSENT    0         /* no record, or an abandoned reservation (whose token is kept) */
#define RESERVED  1
#define COMPLETED 2

/* --- the outbox: one row per command --- */
byte status[NC];            /* all PENDING at the start */
byte token[NC];             /* fencing token of the current or last lease, 0 before the first claim.
                               Each claim adds one to the token and to the attempts and nothing else
                               changes either, so the token also counts the attempts. */

/* --- the receiver: one record per key --- */
byte rstate[NC];
byte rtoken[NC];            /* reservation token; only grows. With UNFENCED it only tells the model's
                               reservations apart: the store neither keeps nor checks it. */
bool reffect_path[NC];      /* EFFECT_BEFORE_FINISH: the current reservation's holder goes for the
                               effect, so the reservation does not time out before it finishes */
byte effects[NC];           /* how often the key's effect happened */

/*
 * Time. A lease or a reservation may run out at any moment, so whether it has run out is a free
 * choice at the only steps that look at it: a claim may take a leased command (its lease ran out just
 * before), and a begin may take a reservation over (it timed out just before) or answer InProgress.
 * This is an "expire" step that may happen at any time, folded into its only readers: complete, fail,
 * finish and abandon check tokens, never the clock, as the code does.
 */

/* Rule 7: pending (always due here), or leased (its lease may have run out). */
#define CLAIMABLE(i)  (status[i] == PENDING || status[i] == LEASED)

/* Rule 8: the token must be the current one and the command leased (expired or not). */
#define HOLDS(i, tk)  (status[i] == LEASED && token[i] == tk)

/* Rule 8: a stale holder changes nothing. So the holder of the current token finds its command still
   leased when it settles (or dead: its lease ran out on the last attempt and a claim buried it). */
#define CURRENT_UNTOUCHED(i, tk)  (token[i] != tk || status[i] == LEASED || status[i] == DEAD)

/* Rule 14: finish and abandon need the current reservation (UNFENCED: any reservation). */
#ifdef UNFENCED
#define RESERVATION_OK(i, r)  (rstate[i] == RESERVED)
#else
#define RESERVATION_OK(i, r)  (rstate[i] == RESERVED && rtoken[i] == r)
#endif

/* Whether a begin may take the current reservation of key i over (it timed out). */
#if defined(EFFECT_BEFORE_FINISH) && !defined(SLOW_EFFECT)
#define TIMED_OUT_MAYBE(i)    (!reffect_path[i])
#else
#define TIMED_OUT_MAYBE(i)    true
#endif

/*
 * Workers. A worker makes one delivery at a time, and the receiver's handler of its request goes with
 * it. A worker is where it is in that delivery plus what it knows: the command, the fencing token of
 * its claim, the reservation token the receiver handed to its request. Workers are interchangeable,
 * so the model keeps the three sorted: states that differ only in which worker is which are one.
 */
#define IDLE          0     /* nothing claimed (also after a crash: all is forgotten) */
#define CLAIMED       1     /* holds a lease; the request has not reached the receiver yet */
#define RESERVING     2     /* the receiver reserved the key for this request (Fresh) */
#define GOING         3     /* EFFECT_BEFORE_FINISH: reserved, and going for the effect */
#define EFFECTED      4     /* EFFECT_BEFORE_FINISH: the effect happened, finish not yet */
#define RESULT        5     /* holds a verifiable result (the answer may still have been lost) */
#define NO_RESULT     6     /* InProgress, abandoned or refused: no result */

byte stage[NW];
byte wcmd[NW];
byte wtok[NW];
byte wres[NW];

/* Rule 8: only a verifiable result completes a command. */
#ifdef ACK_WITHOUT_RESULT
#define MAY_COMPLETE(k)  (stage[k] == RESULT || stage[k] == NO_RESULT)
#else
#define MAY_COMPLETE(k)  (stage[k] == RESULT)
#endif

#define ORDER(k)  (((stage[k] * NC + wcmd[k]) * 16 + wtok[k]) * 16 + wres[k])

inline swap_if_greater(a, b) {
	if
	:: ORDER(a) > ORDER(b) ->
		tmp = stage[a]; stage[a] = stage[b]; stage[b] = tmp;
		tmp = wcmd[a]; wcmd[a] = wcmd[b]; wcmd[b] = tmp;
		tmp = wtok[a]; wtok[a] = wtok[b]; wtok[b] = tmp;
		tmp = wres[a]; wres[a] = wres[b]; wres[b] = tmp
	:: else -> skip
	fi
}

inline sort_workers() {
	d_step {
		swap_if_greater(0, 1);
		swap_if_greater(1, 2);
		swap_if_greater(0, 1);
		tmp = 0
	}
}

/* Every change of a row's status: done and dead are final (only a person's retry or resolve, not
   modelled, moves them on), so a late or stale settle must never reach them. */
inline set_status(i, s) {
	assert(status[i] != DONE && status[i] != DEAD);
	status[i] = s
}

/* Claim command i for worker k: a fresh token and one more attempt, or dead (rule 9). */
inline claim(k, i) {
	if
	:: status[i] == LEASED && token[i] >= MAX_ATTEMPTS ->
		set_status(i, DEAD);
		printf("c%d: lease ran out on the last attempt: dead\n", i)
	:: else ->
		token[i] = token[i] + 1;
		set_status(i, LEASED);
		stage[k] = CLAIMED;
		wcmd[k] = i;
		wtok[k] = token[i];
		printf("c%d/t%d: claimed\n", i, token[i])
	fi
}

inline forget(k) {          /* back to idle: a crash, or the delivery is over */
	stage[k] = IDLE; wcmd[k] = 0; wtok[k] = 0; wres[k] = 0
}

/* Short names inside step(k), for worker k's fields; undefined after it. */
#define c  wcmd[k]          /* the command of worker k, also the key of its request */
#define t  wtok[k]          /* the fencing token of its claim */
#define r  wres[k]          /* the reservation token of its request */

/*
 * One step of worker k, or of the receiver's handler of its request. Each step is atomic; any number
 * of other steps may come between two of them (a slow worker, a late ack).
 */
inline step(k) {
	if
	/* claim one claimable command */
	:: stage[k] == IDLE && CLAIMABLE(0) -> claim(k, 0)
	:: stage[k] == IDLE && CLAIMABLE(1) -> claim(k, 1)

	/* the worker crashes, or its request is lost on the way */
	:: stage[k] == CLAIMED ->
		printf("c%d/t%d: worker crashed before the request arrived\n", c, t);
		forget(k)

	/* begin(key): the request, carrying the command ID as its key, reaches the receiver */
	:: stage[k] == CLAIMED && rstate[c] == COMPLETED ->
		printf("c%d/t%d: begin: Completed, the stored result\n", c, t);
		stage[k] = RESULT
	:: stage[k] == CLAIMED && rstate[c] == RESERVED ->
		printf("c%d/t%d: begin: InProgress\n", c, t);
		stage[k] = NO_RESULT
	:: stage[k] == CLAIMED &&
	   (rstate[c] == ABSENT || (rstate[c] == RESERVED && TIMED_OUT_MAYBE(c))) ->
		/* Fresh: no record, or a reservation that timed out is taken over */
		rtoken[c] = rtoken[c] + 1;
		rstate[c] = RESERVED;
		r = rtoken[c];
		reffect_path[c] = false;
		stage[k] = RESERVING;
		printf("c%d/t%d: begin: Fresh, reservation r%d\n", c, t, r)
#ifdef EFFECT_BEFORE_FINISH
		;
		if
		:: skip                                      /* will abandon, or crash first */
		:: stage[k] = GOING; reffect_path[c] = true  /* goes for the effect */
		fi
#endif

#ifndef EFFECT_BEFORE_FINISH
	/* the effect and finish, one transaction, under the token check */
	:: stage[k] == RESERVING ->
		if
		:: RESERVATION_OK(c, r) ->
			effects[c] = effects[c] + 1;
			printf("c%d/t%d: effect and finish with r%d: effects = %d\n", c, t, r, effects[c]);
			assert(effects[c] <= 1);                 /* no double effect */
			rstate[c] = COMPLETED;
			stage[k] = RESULT
		:: else ->
			printf("c%d/t%d: finish with r%d refused, no effect\n", c, t, r);
			stage[k] = NO_RESULT                     /* a stale holder changes nothing */
		fi;
		r = 0
#else
	/* the effect, then finish in a later step */
	:: stage[k] == GOING ->
		effects[c] = effects[c] + 1;
		printf("c%d/t%d: effect under r%d: effects = %d\n", c, t, r, effects[c]);
		assert(effects[c] <= 1);                     /* no double effect */
		stage[k] = EFFECTED
	:: stage[k] == EFFECTED ->
		if
		:: RESERVATION_OK(c, r) ->
			printf("c%d/t%d: finish with r%d\n", c, t, r);
			rstate[c] = COMPLETED;
			stage[k] = RESULT
		:: else ->
			printf("c%d/t%d: finish with r%d refused\n", c, t, r);
			stage[k] = NO_RESULT
		fi;
		if
		:: rtoken[c] == r -> reffect_path[c] = false
		:: else -> skip
		fi;
		r = 0
#endif

	/* abandon: the effect did not happen; releases the reservation (the token stays), or with
	   UNFENCED deletes the record, whoever holds it */
	:: stage[k] == RESERVING ->
		if
		:: RESERVATION_OK(c, r) ->
#ifdef UNFENCED
			printf("c%d/t%d: abandon with r%d: record (now r%d) deleted\n", c, t, r, rtoken[c]);
#else
			printf("c%d/t%d: abandon with r%d: released\n", c, t, r);
#endif
			rstate[c] = ABSENT
		:: else ->
			printf("c%d/t%d: abandon with r%d: refused\n", c, t, r)
		fi;
		r = 0;
		stage[k] = NO_RESULT

	/* the receiver crashes before its effect: the reservation stays until it times out */
	:: stage[k] == RESERVING ->
		printf("c%d/t%d: receiver crashed holding r%d\n", c, t, r);
		forget(k)

	/* complete(id, token), maybe late: after a takeover the token is stale (StaleLease) */
	:: MAY_COMPLETE(k) ->
		assert(CURRENT_UNTOUCHED(c, t));
		if
		:: HOLDS(c, t) ->
			printf("c%d/t%d: complete: done\n", c, t);
			assert(effects[c] == 1);                 /* done only with its one effect */
			set_status(c, DONE)
		:: else ->
			printf("c%d/t%d: complete: stale lease\n", c, t)
		fi;
		forget(k)

	/* fail(id, token, retryable): InProgress, abandoned, refused, or the answer was lost (an unknown
	   outcome is retried with the same ID); stale after a takeover */
	:: stage[k] == RESULT || stage[k] == NO_RESULT ->
		assert(CURRENT_UNTOUCHED(c, t));
		if
		:: HOLDS(c, t) && token[c] >= MAX_ATTEMPTS ->
			printf("c%d/t%d: fail: dead\n", c, t);
			set_status(c, DEAD)
		:: HOLDS(c, t) && token[c] < MAX_ATTEMPTS ->
			printf("c%d/t%d: fail: pending again\n", c, t);
			set_status(c, PENDING)
		:: else ->
			printf("c%d/t%d: fail: stale lease\n", c, t)
		fi;
		forget(k)

	/* the worker crashes, or walks away: its lease runs out */
	:: stage[k] == RESULT || stage[k] == NO_RESULT ->
		printf("c%d/t%d: worker crashed or walked away\n", c, t);
		forget(k)
	fi
}

#undef c
#undef t
#undef r

active proctype System()
{
	byte i;
	byte tmp;
end:
	do
	:: atomic { step(0); sort_workers() }
	:: atomic { step(1); sort_workers() }
	:: atomic { step(2); sort_workers() }
	:: timeout ->
		/* nothing can move any more: every command is settled, none is lost */
		for (i : 0 .. NC - 1) {
			printf("c%d: status %d (2 done, 3 dead), %d effect(s)\n", i, status[i], effects[i]);
			assert(effects[i] <= 1);
			assert(status[i] == DONE || status[i] == DEAD);
			assert(status[i] != DONE || effects[i] == 1)
		}
		break
	od
}
