//! One tapped connection: feeds both byte streams to the protocol's framer, pairs requests with
//! replies in order, emits round trips, and turns the holder's answers into engine holds at the
//! offset where the write's first new request starts.

use super::{Clock, Holder, Protocol, Reply, Request, RoundTrip, Sink, WireTap};
use bytes::Bytes;
use futures::future::BoxFuture;
use noxious::tap::{ConnTap, Hold, Release};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;
use tokio::sync::oneshot;

/// Requests in flight on one connection beyond which it is no longer recorded: a client that
/// pipelines without reading would otherwise grow the queue without bound.
const MAX_IN_FLIGHT: usize = 10_000;

/// What a framer reports, in stream order. Per connection, `Start`s, `Ready`s, `Done`s and
/// `Reply`s each come in request order.
#[derive(Debug)]
pub(crate) enum Ev {
    /// A new request starts at this offset of the client chunk being framed.
    Start(usize),
    /// The oldest request not yet ready is known well enough to decide on holding it (a Redis
    /// command is complete; a PostgreSQL batch reached Sync or Flush; HTTP headers are complete).
    Ready(Request),
    /// The oldest request not yet done is complete; `Some` replaces what `Ready` said.
    Done(Option<Request>),
    /// The reply to the oldest request not yet answered.
    Reply(Reply),
    /// The most recent `Start` was no request after all (an empty command Redis ignores).
    Cancel,
    /// Framing is lost (TLS, garbage, an unfollowed mode): stop recording this connection.
    Opaque(String),
}

/// A protocol's framer for one connection.
pub(crate) trait Framer: Send {
    /// Client bytes, in order.
    fn client(&mut self, data: &[u8], ev: &mut Vec<Ev>);
    /// Server bytes, in order.
    fn server(&mut self, data: &[u8], ev: &mut Vec<Ev>);
    /// The connection ended (a reply delimited by the close ends here).
    fn closed(&mut self, ev: &mut Vec<Ev>) {
        let _ = ev;
    }
}

pub(crate) fn framer(protocol: Protocol) -> Box<dyn Framer> {
    match protocol {
        Protocol::Redis => Box::new(super::redis::RedisFramer::default()),
        Protocol::Postgres => Box::new(super::postgres::PgFramer::default()),
        Protocol::Http => Box::new(super::http::HttpFramer::default()),
    }
}

pub(crate) struct Connection {
    link: Arc<str>,
    conn: u64,
    sink: Arc<dyn Sink>,
    holder: Option<Arc<dyn Holder>>,
    clock: Clock,
    me: Weak<Connection>,
    state: Mutex<State>,
}

struct State {
    framer: Box<dyn Framer>,
    opaque: bool,
    next_seq: u64,
    trips: VecDeque<Trip>,
    /// Hold decisions not yet made (their requests are not all ready), oldest first.
    groups: VecDeque<Group>,
    events: Vec<Ev>,
}

struct Trip {
    seq: u64,
    sent: Instant,
    forwarded: Option<Instant>,
    request: Option<Request>,
    done: bool,
    reply: Option<(Reply, Instant)>,
}

struct Group {
    seqs: Vec<u64>,
    /// Where the decision goes; `None` for the group of the write being framed now.
    decide: Option<oneshot::Sender<Option<BoxFuture<'static, Release>>>>,
}

/// A decision to make outside the lock: ask the holder about these requests.
struct Ask {
    seqs: Vec<u64>,
    requests: Vec<Request>,
    decide: Option<oneshot::Sender<Option<BoxFuture<'static, Release>>>>,
}

impl Connection {
    pub(crate) fn open(tap: &WireTap, conn: u64) -> Arc<Connection> {
        Arc::new_cyclic(|me| Connection {
            link: tap.link.clone(),
            conn,
            sink: tap.sink.clone(),
            holder: tap.holder.clone(),
            clock: tap.clock,
            me: me.clone(),
            state: Mutex::new(State {
                framer: framer(tap.protocol),
                opaque: false,
                next_seq: 0,
                trips: VecDeque::new(),
                groups: VecDeque::new(),
                events: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not stop forwarding: the state is still consistent enough to
        // finish or go opaque.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn trip(&self, trip: Trip) -> Option<RoundTrip> {
        Some(RoundTrip {
            link: self.link.to_string(),
            conn: self.conn,
            seq: trip.seq,
            sent_us: self.clock.micros(trip.sent),
            forwarded_us: trip.forwarded.map(|at| self.clock.micros(at)),
            answered_us: trip.reply.as_ref().map(|(_, at)| self.clock.micros(*at)),
            request: trip.request?,
            reply: trip.reply.map(|(reply, _)| reply),
        })
    }

    /// Applies the framer's events. Returns the offset of the first request started in this
    /// client chunk (if any) and the reason if framing was lost.
    fn apply(&self, st: &mut State, now: Instant, client: bool) -> (Option<usize>, Option<String>) {
        let mut first_start = None;
        let mut started = Vec::new();
        let events = std::mem::take(&mut st.events);
        let mut lost = None;
        for ev in events {
            match ev {
                Ev::Start(offset) => {
                    if st.trips.len() >= MAX_IN_FLIGHT {
                        lost = Some(format!("more than {MAX_IN_FLIGHT} requests in flight"));
                        break;
                    }
                    first_start.get_or_insert(offset);
                    let seq = st.next_seq;
                    st.next_seq += 1;
                    st.trips.push_back(Trip {
                        seq,
                        sent: now,
                        forwarded: if self.holder.is_some() {
                            None
                        } else {
                            Some(now)
                        },
                        request: None,
                        done: false,
                        reply: None,
                    });
                    started.push(seq);
                }
                Ev::Ready(request) => match st.trips.iter_mut().find(|t| t.request.is_none()) {
                    Some(trip) => trip.request = Some(request),
                    None => {
                        lost = Some("framer out of step: a request that never started".into());
                        break;
                    }
                },
                Ev::Done(request) => match st.trips.iter_mut().find(|t| !t.done) {
                    Some(trip) => {
                        trip.done = true;
                        if request.is_some() {
                            trip.request = request;
                        }
                    }
                    None => {
                        lost = Some("framer out of step: a request done twice".into());
                        break;
                    }
                },
                Ev::Reply(reply) => match st.trips.iter_mut().find(|t| t.reply.is_none()) {
                    Some(trip) => trip.reply = Some((reply, now)),
                    None => {
                        lost = Some("a reply with no request".into());
                        break;
                    }
                },
                Ev::Cancel => {
                    if let Some(trip) = st.trips.pop_back() {
                        started.retain(|seq| *seq != trip.seq);
                        for group in st.groups.iter_mut() {
                            group.seqs.retain(|seq| *seq != trip.seq);
                        }
                        // A group left with no request is no hold: release it.
                        while let Some(i) = st.groups.iter().position(|g| g.seqs.is_empty()) {
                            if let Some(decide) = st.groups.remove(i).and_then(|g| g.decide) {
                                let _ = decide.send(None);
                            }
                        }
                        if started.is_empty() {
                            first_start = None;
                        }
                    }
                }
                Ev::Opaque(reason) => {
                    lost = Some(reason);
                    break;
                }
            }
        }
        if client && !started.is_empty() && self.holder.is_some() {
            st.groups.push_back(Group {
                seqs: started,
                decide: None,
            });
        }
        (first_start, lost)
    }

    /// Takes the hold decisions that can be made now (all their requests ready), in order.
    fn decidable(st: &mut State) -> Vec<Ask> {
        let mut asks = Vec::new();
        while let Some(group) = st.groups.front() {
            let requests: Option<Vec<Request>> = group
                .seqs
                .iter()
                .map(|seq| {
                    st.trips
                        .iter()
                        .find(|t| t.seq == *seq)
                        .and_then(|t| t.request.clone())
                })
                .collect();
            let Some(requests) = requests else { break };
            let group = st.groups.pop_front().expect("front exists");
            asks.push(Ask {
                seqs: group.seqs,
                requests,
                decide: group.decide,
            });
        }
        asks
    }

    /// Takes the round trips that are complete, in order.
    fn finished(&self, st: &mut State) -> Vec<RoundTrip> {
        let mut out = Vec::new();
        while st
            .trips
            .front()
            .is_some_and(|t| t.done && t.reply.is_some() && t.forwarded.is_some())
        {
            let trip = st.trips.pop_front().expect("front exists");
            out.extend(self.trip(trip));
        }
        out
    }

    /// Stops recording: releases every pending hold, emits what is known.
    fn go_opaque(&self, st: &mut State, reason: Option<&str>) -> Vec<RoundTrip> {
        st.opaque = true;
        for group in st.groups.drain(..) {
            if let Some(decide) = group.decide {
                let _ = decide.send(None);
            }
        }
        st.events.clear();
        let trips: Vec<Trip> = st.trips.drain(..).collect();
        if let Some(reason) = reason {
            tracing::debug!(link = %self.link, conn = self.conn, %reason, "wire: connection opaque");
        }
        trips.into_iter().filter_map(|t| self.trip(t)).collect()
    }

    fn mark_forwarded(&self, seqs: &[u64], at: Instant) -> Vec<RoundTrip> {
        let mut st = self.lock();
        for trip in st.trips.iter_mut().filter(|t| seqs.contains(&t.seq)) {
            trip.forwarded.get_or_insert(at);
        }
        self.finished(&mut st)
    }

    fn emit(&self, trips: Vec<RoundTrip>) {
        for trip in trips {
            self.sink.round_trip(trip);
        }
    }

    /// Asks the holder, in order; returns the decision for the write being framed (the ask with
    /// no channel), and sends the others' decisions to their waiting holds.
    fn ask(&self, asks: Vec<Ask>) -> Option<Option<BoxFuture<'static, Release>>> {
        let holder = self.holder.as_ref()?;
        let mut current = None;
        for ask in asks {
            let first = ask.seqs.first().copied().unwrap_or_default();
            let hold = holder.before(&self.link, self.conn, first, &ask.requests);
            let hold = match hold {
                None => {
                    let done = self.mark_forwarded(&ask.seqs, Instant::now());
                    self.emit(done);
                    None
                }
                Some(hold) => {
                    let me = self.me.clone();
                    let seqs = ask.seqs;
                    Some(Box::pin(async move {
                        let release = hold.await;
                        // An aborted request never reaches its server: no round trip of it.
                        if release == Release::Forward
                            && let Some(me) = me.upgrade()
                        {
                            let done = me.mark_forwarded(&seqs, Instant::now());
                            me.emit(done);
                        }
                        release
                    }) as BoxFuture<'static, Release>)
                }
            };
            match ask.decide {
                Some(decide) => {
                    let _ = decide.send(hold);
                }
                None => current = Some(hold),
            }
        }
        current
    }
}

impl ConnTap for Connection {
    fn to_server(&self, data: &Bytes) -> Option<Hold> {
        let now = Instant::now();
        let mut guard = self.lock();
        if guard.opaque {
            return None;
        }
        let st = &mut *guard;
        let mut events = std::mem::take(&mut st.events);
        st.framer.client(data, &mut events);
        st.events = events;
        let (first_start, lost) = self.apply(st, now, true);
        if let Some(reason) = lost {
            let trips = self.go_opaque(st, Some(&reason));
            drop(guard);
            self.emit(trips);
            self.sink.opaque(&self.link, self.conn, &reason);
            return None;
        }
        let asks = Self::decidable(st);
        // The write's own group, if still undecided, waits for a decision made on later bytes.
        let pending = match (first_start, st.groups.back_mut()) {
            (Some(_), Some(group)) if group.decide.is_none() => {
                let (tx, rx) = oneshot::channel();
                group.decide = Some(tx);
                Some(rx)
            }
            _ => None,
        };
        let finished = self.finished(st);
        drop(guard);
        self.emit(finished);
        let decided = self.ask(asks);
        let at = first_start?;
        if let Some(rx) = pending {
            return Some(Hold::new(at, async move {
                match rx.await {
                    Ok(Some(hold)) => hold.await,
                    _ => Release::Forward,
                }
            }));
        }
        decided.flatten().map(|hold| Hold { at, until: hold })
    }

    fn to_client(&self, data: &Bytes) {
        let now = Instant::now();
        let mut guard = self.lock();
        if guard.opaque {
            return;
        }
        let st = &mut *guard;
        let mut events = std::mem::take(&mut st.events);
        st.framer.server(data, &mut events);
        st.events = events;
        let (_, lost) = self.apply(st, now, false);
        let trips = match &lost {
            Some(reason) => self.go_opaque(st, Some(reason)),
            None => self.finished(st),
        };
        drop(guard);
        self.emit(trips);
        if let Some(reason) = lost {
            self.sink.opaque(&self.link, self.conn, &reason);
        }
    }

    fn closed(&self) {
        let now = Instant::now();
        let mut guard = self.lock();
        if guard.opaque {
            return;
        }
        let st = &mut *guard;
        let mut events = std::mem::take(&mut st.events);
        st.framer.closed(&mut events);
        st.events = events;
        let _ = self.apply(st, now, false);
        let trips = self.go_opaque(st, None);
        drop(guard);
        self.emit(trips);
    }
}
