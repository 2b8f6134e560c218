//! racecert patch: taps. A tap sees every byte a proxied connection carries, in order, in both
//! directions, and may hold the client's bytes before they go upstream. racecert frames the
//! protocols (RESP, PostgreSQL, HTTP) in a tap to record round trips, and holds a worker's next
//! round trip to schedule it.
//!
//! A tap is attached when a proxy run starts ([`crate::proxy::ProxyRunner::run_proxy_with_tap`]);
//! it is asked for a [`ConnTap`] per accepted connection. A proxy run without a tap reads and
//! forwards exactly as upstream noxious does.
//!
//! The tap sits where the engine reads a socket, before the toxic chain: it observes the bytes as
//! the peer sent them (toxics then change their timing or drop them as usual), and a hold delays
//! the bytes before any toxic sees them. Because the tap lives in the reader, it survives the
//! engine rebuilding a connection's links when toxics change, and a held chunk is neither lost
//! nor duplicated by that rebuild.

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::Stream;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio_util::codec::{BytesCodec, FramedRead};

use crate::socket::ReadStream;

/// How many client bytes the engine reads ahead of a pending hold (and hands to
/// [`ConnTap::to_server`]) before it stops reading that client until the hold resolves.
///
/// Reading ahead lets a tap see the rest of a request whose first bytes it was asked to hold (a
/// request split over several reads), so it can decide on the whole request. A tap whose hold
/// waits for more bytes must resolve it by the time it has seen this many bytes past the hold,
/// or the connection stays held until the proxy stops.
pub const READ_AHEAD_LIMIT: usize = 4 * 1024 * 1024;

/// Attached to a proxy run: opens a [`ConnTap`] for every connection the proxy accepts.
pub trait Tap: Send + Sync + 'static {
    /// Called once per accepted connection, after the upstream connection is made and before any
    /// byte is forwarded.
    fn open(&self, conn: ConnInfo) -> Arc<dyn ConnTap>;
}

/// The connection a [`ConnTap`] watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Unique among all connections of all proxies of this process (a process-wide counter).
    pub id: u64,
    /// The proxy's name.
    pub proxy: String,
    /// The client's address (the connecting peer).
    pub client: SocketAddr,
    /// The upstream the proxy connected to, as configured (`host:port`): the engine connects by
    /// this name, so it is what the proxy knows without asking the socket.
    pub upstream: String,
}

/// Watches one connection. Calls come from the engine's reader tasks: `to_server` calls are in
/// client byte order, `to_client` calls in server byte order, and a `to_server` call always
/// precedes the forwarding of its bytes (so a reply is observed after the request it answers).
pub trait ConnTap: Send + Sync + 'static {
    /// Bytes the client sent, in order, before they go upstream. Returning a [`Hold`] delays the
    /// forwarding of this chunk from [`Hold::at`] on until [`Hold::until`] resolves; the engine
    /// keeps reading (and calling this) meanwhile, up to [`READ_AHEAD_LIMIT`] bytes, and forwards
    /// everything in order once released. Bytes are never reordered by a hold, and dropped only
    /// when it ends in [`Release::Abort`].
    fn to_server(&self, data: &Bytes) -> Option<Hold>;
    /// Bytes the server sent, in order, before they reach the client.
    fn to_client(&self, data: &Bytes);
    /// The connection is gone (either side closed, or the proxy stopped or was disabled). Called
    /// exactly once, after the last `to_server`/`to_client` call; a pending hold is dropped
    /// before this call.
    fn closed(&self);
}

/// How a hold ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The held bytes (and what came after them) go upstream.
    Forward,
    /// The held bytes and everything the client sent after them are discarded and the connection
    /// ends, as if the client had died before sending them (a tap that kills the client while
    /// it holds its next request: what the client wrote last never reaches the server).
    Abort,
}

/// A hold on client bytes: forward `data[..at]` now, the rest once `until` resolves.
pub struct Hold {
    /// Offset in the chunk passed to [`ConnTap::to_server`] where the hold starts (clamped to the
    /// chunk's length). A tap holds at a request boundary, which need not be the chunk's start.
    pub at: usize,
    /// Resolves when the held bytes may go upstream, or must never. Dropped unresolved if the
    /// connection ends.
    pub until: BoxFuture<'static, Release>,
}

impl Hold {
    /// A hold from offset `at` of the chunk until `until` resolves.
    pub fn new(at: usize, until: impl Future<Output = Release> + Send + 'static) -> Hold {
        Hold {
            at,
            until: Box::pin(until),
        }
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold").field("at", &self.at).finish()
    }
}

/// Opens a connection's [`ConnTap`] and calls [`ConnTap::closed`] when the last reader of the
/// connection is dropped: both readers own one, and the engine drops them only when the
/// connection ends (a toxic change moves them to the new links).
pub(crate) struct ConnGuard(Arc<dyn ConnTap>);

impl ConnGuard {
    pub(crate) fn open(tap: &dyn Tap, conn: ConnInfo) -> Arc<ConnGuard> {
        Arc::new(ConnGuard(tap.open(conn)))
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.closed();
    }
}

/// Which way the bytes a reader yields go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Read from the client, forwarded to the server: observed, and may be held.
    ToServer,
    /// Read from the server, forwarded to the client: observed only.
    ToClient,
}

/// A socket reader yielding chunks, with an optional tap. Untapped, it is the plain framed reader.
pub(crate) struct Read {
    inner: FramedRead<ReadStream, BytesCodec>,
    tap: Option<TapState>,
}

struct TapState {
    conn: Arc<ConnGuard>,
    flow: Flow,
    /// Chunks read but not yet yielded, in order; a segment with a hold waits until it resolves,
    /// and everything behind it waits too.
    queue: VecDeque<Segment>,
    queued: usize,
    /// The socket ended (EOF); yielded once the queue is empty.
    ended: bool,
    /// The socket failed; yielded once the queue is empty.
    error: Option<io::Error>,
    /// A hold ended in [`Release::Abort`]: nothing more is read or forwarded.
    aborted: bool,
}

struct Segment {
    bytes: Bytes,
    hold: Option<BoxFuture<'static, Release>>,
}

impl Read {
    pub(crate) fn new(
        inner: FramedRead<ReadStream, BytesCodec>,
        tap: Option<(Arc<ConnGuard>, Flow)>,
    ) -> Read {
        Read {
            inner,
            tap: tap.map(|(conn, flow)| TapState {
                conn,
                flow,
                queue: VecDeque::new(),
                queued: 0,
                ended: false,
                error: None,
                aborted: false,
            }),
        }
    }

    pub(crate) fn get_ref(&self) -> &ReadStream {
        self.inner.get_ref()
    }
}

impl From<FramedRead<ReadStream, BytesCodec>> for Read {
    fn from(inner: FramedRead<ReadStream, BytesCodec>) -> Read {
        Read::new(inner, None)
    }
}

impl fmt::Debug for Read {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Read")
            .field("tapped", &self.tap.as_ref().map(|tap| tap.flow))
            .field("queued", &self.tap.as_ref().map_or(0, |tap| tap.queued))
            .finish()
    }
}

impl TapState {
    fn push(&mut self, bytes: Bytes, hold: Option<BoxFuture<'static, Release>>) {
        self.queued += bytes.len();
        self.queue.push_back(Segment { bytes, hold });
    }

    /// Takes a client chunk: asks the tap, and queues the chunk split at the hold, if any.
    fn take_to_server(&mut self, chunk: Bytes) {
        match self.conn.0.to_server(&chunk) {
            None => self.push(chunk, None),
            Some(Hold { at, until }) => {
                let at = at.min(chunk.len());
                if at > 0 {
                    self.push(chunk.slice(..at), None);
                }
                // An empty held segment still orders the hold before the next chunk.
                self.push(chunk.slice(at..), Some(until));
            }
        }
    }

    fn poll_to_server(
        &mut self,
        inner: &mut FramedRead<ReadStream, BytesCodec>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            if self.aborted {
                return Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "a tap aborted the connection at a held request",
                ))));
            }
            if let Some(front) = self.queue.front_mut() {
                let released = match front.hold.as_mut() {
                    None => true,
                    Some(until) => match until.as_mut().poll(cx) {
                        Poll::Ready(Release::Forward) => true,
                        Poll::Ready(Release::Abort) => {
                            // Nothing from the held request on reaches the server; the reader
                            // ends with an error, which closes the connection.
                            self.queue.clear();
                            self.queued = 0;
                            self.aborted = true;
                            continue;
                        }
                        Poll::Pending => false,
                    },
                };
                if released {
                    let segment = self.queue.pop_front().expect("front exists");
                    self.queued -= segment.bytes.len();
                    if segment.bytes.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(segment.bytes)));
                }
            } else if let Some(err) = self.error.take() {
                return Poll::Ready(Some(Err(err)));
            } else if self.ended {
                return Poll::Ready(None);
            }
            // Nothing to yield: the queue is empty, or its front is held. Read (ahead).
            if self.ended || self.error.is_some() || self.queued >= READ_AHEAD_LIMIT {
                return Poll::Pending;
            }
            match Pin::new(&mut *inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.ended = true,
                Poll::Ready(Some(Err(err))) => self.error = Some(err),
                Poll::Ready(Some(Ok(chunk))) => self.take_to_server(chunk.freeze()),
            }
        }
    }
}

impl Stream for Read {
    type Item = io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.tap.as_mut() {
            None => Pin::new(&mut this.inner)
                .poll_next(cx)
                .map(|item| item.map(|chunk| chunk.map(BytesMut::freeze))),
            Some(tap) if tap.flow == Flow::ToServer => tap.poll_to_server(&mut this.inner, cx),
            Some(tap) => match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    let chunk = chunk.freeze();
                    tap.conn.0.to_client(&chunk);
                    Poll::Ready(Some(Ok(chunk)))
                }
                other => other.map(|item| item.map(|chunk| chunk.map(BytesMut::freeze))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{FutureExt, StreamExt};
    use std::sync::Mutex;
    use tokio::sync::oneshot;
    use tokio_test::io::Builder;

    /// Records what it is shown; holds the client chunks its script says to hold.
    #[derive(Default)]
    struct Script {
        seen: Mutex<Vec<(Flow, Bytes)>>,
        holds: Mutex<VecDeque<Option<Hold>>>,
        closed: Mutex<usize>,
    }

    impl ConnTap for Script {
        fn to_server(&self, data: &Bytes) -> Option<Hold> {
            self.seen.lock().unwrap().push((Flow::ToServer, data.clone()));
            self.holds.lock().unwrap().pop_front().flatten()
        }
        fn to_client(&self, data: &Bytes) {
            self.seen.lock().unwrap().push((Flow::ToClient, data.clone()));
        }
        fn closed(&self) {
            *self.closed.lock().unwrap() += 1;
        }
    }

    fn reader(builder: &mut Builder, script: &Arc<Script>, flow: Flow) -> Read {
        let conn = Arc::new(ConnGuard(script.clone()));
        Read::new(
            FramedRead::new(ReadStream::new(builder.build()), BytesCodec::new()),
            Some((conn, flow)),
        )
    }

    fn next_now(read: &mut Read) -> Option<Option<Bytes>> {
        read.next()
            .now_or_never()
            .map(|item| item.map(|chunk| chunk.expect("no I/O error")))
    }

    #[tokio::test]
    async fn client_chunks_are_seen_then_forwarded_unchanged_in_order() {
        let script = Arc::new(Script::default());
        let mut read = reader(
            Builder::new().read(b"*1\r\n$4\r\nPING\r\n").read(b"GET k\r\n"),
            &script,
            Flow::ToServer,
        );
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"))));
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"GET k\r\n"))));
        assert_eq!(next_now(&mut read), Some(None));
        let seen = script.seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                (Flow::ToServer, Bytes::from_static(b"*1\r\n$4\r\nPING\r\n")),
                (Flow::ToServer, Bytes::from_static(b"GET k\r\n")),
            ]
        );
        drop(read);
        assert_eq!(*script.closed.lock().unwrap(), 1);
    }

    #[tokio::test]
    async fn server_chunks_are_seen_and_never_held() {
        let script = Arc::new(Script::default());
        let (_never, held) = oneshot::channel::<()>();
        script
            .holds
            .lock()
            .unwrap()
            .push_back(Some(Hold::new(0, held.map(|_| Release::Forward))));
        let mut read = reader(Builder::new().read(b"+PONG\r\n"), &script, Flow::ToClient);
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"+PONG\r\n"))));
        assert_eq!(
            script.seen.lock().unwrap().clone(),
            vec![(Flow::ToClient, Bytes::from_static(b"+PONG\r\n"))]
        );
    }

    #[tokio::test]
    async fn a_hold_forwards_the_bytes_before_it_then_waits_and_reads_ahead() {
        let script = Arc::new(Script::default());
        let (release, held) = oneshot::channel::<()>();
        {
            let mut holds = script.holds.lock().unwrap();
            // The first chunk ends one request and starts the next: hold from its start.
            holds.push_back(Some(Hold::new(9, held.map(|_| Release::Forward))));
        }
        let mut read = reader(
            Builder::new().read(b"SET a 1\r\nGET").read(b" a\r\n"),
            &script,
            Flow::ToServer,
        );
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"SET a 1\r\n"))));
        // Held: nothing more comes out, but the rest of the request was read and shown.
        assert_eq!(next_now(&mut read), None);
        assert_eq!(next_now(&mut read), None);
        assert_eq!(script.seen.lock().unwrap().len(), 2);
        release.send(()).unwrap();
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"GET"))));
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b" a\r\n"))));
        assert_eq!(next_now(&mut read), Some(None));
    }

    #[tokio::test]
    async fn the_end_of_the_stream_waits_behind_held_bytes() {
        let script = Arc::new(Script::default());
        let (release, held) = oneshot::channel::<()>();
        script
            .holds
            .lock()
            .unwrap()
            .push_back(Some(Hold::new(0, held.map(|_| Release::Forward))));
        let mut read = reader(Builder::new().read(b"QUIT\r\n"), &script, Flow::ToServer);
        assert_eq!(next_now(&mut read), None);
        release.send(()).unwrap();
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"QUIT\r\n"))));
        assert_eq!(next_now(&mut read), Some(None));
    }

    #[tokio::test]
    async fn an_aborted_hold_drops_its_bytes_and_what_follows_and_ends_the_connection() {
        let script = Arc::new(Script::default());
        let (release, held) = oneshot::channel::<Release>();
        script
            .holds
            .lock()
            .unwrap()
            .push_back(Some(Hold::new(9, held.map(|r| r.unwrap_or(Release::Forward)))));
        let mut read = reader(
            Builder::new().read(b"SET a 1\r\nSET b 2\r\n").read(b"SET c 3\r\n"),
            &script,
            Flow::ToServer,
        );
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"SET a 1\r\n"))));
        assert_eq!(next_now(&mut read), None);
        release.send(Release::Abort).unwrap();
        let ended = read.next().now_or_never().expect("ready").expect("an item");
        assert_eq!(
            ended.expect_err("an error ends it").kind(),
            io::ErrorKind::ConnectionAborted
        );
    }

    #[tokio::test]
    async fn a_hold_at_the_end_of_a_chunk_holds_the_next_one() {
        let script = Arc::new(Script::default());
        let (release, held) = oneshot::channel::<()>();
        script
            .holds
            .lock()
            .unwrap()
            .push_back(Some(Hold::new(usize::MAX, held.map(|_| Release::Forward))));
        let mut read = reader(
            Builder::new().read(b"first").read(b"second"),
            &script,
            Flow::ToServer,
        );
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"first"))));
        assert_eq!(next_now(&mut read), None);
        release.send(()).unwrap();
        assert_eq!(next_now(&mut read), Some(Some(Bytes::from_static(b"second"))));
    }

    #[tokio::test]
    async fn reading_ahead_stops_at_the_limit() {
        let script = Arc::new(Script::default());
        let (release, held) = oneshot::channel::<()>();
        script
            .holds
            .lock()
            .unwrap()
            .push_back(Some(Hold::new(0, held.map(|_| Release::Forward))));
        let block = vec![b'x'; 1024 * 1024];
        let mut builder = Builder::new();
        for _ in 0..6 {
            builder.read(&block);
        }
        let mut read = reader(&mut builder, &script, Flow::ToServer);
        assert_eq!(next_now(&mut read), None);
        let seen: usize = script.seen.lock().unwrap().iter().map(|(_, b)| b.len()).sum();
        assert!(
            (READ_AHEAD_LIMIT..6 * block.len()).contains(&seen),
            "read {seen} bytes ahead of a hold"
        );
        release.send(()).unwrap();
        let mut total = 0;
        while let Some(Some(chunk)) = next_now(&mut read) {
            assert!(chunk.iter().all(|b| *b == b'x'));
            total += chunk.len();
        }
        assert_eq!(total, 6 * block.len());
    }

    #[tokio::test]
    async fn dropping_a_held_reader_drops_the_hold_and_closes_the_tap_once() {
        let script = Arc::new(Script::default());
        let (mut release, held) = oneshot::channel::<()>();
        script
            .holds
            .lock()
            .unwrap()
            .push_back(Some(Hold::new(0, held.map(|_| Release::Forward))));
        let conn = Arc::new(ConnGuard(script.clone()));
        let mut to_server = Read::new(
            FramedRead::new(
                ReadStream::new(Builder::new().read(b"held").build()),
                BytesCodec::new(),
            ),
            Some((conn.clone(), Flow::ToServer)),
        );
        let to_client = Read::new(
            FramedRead::new(ReadStream::new(Builder::new().build()), BytesCodec::new()),
            Some((conn, Flow::ToClient)),
        );
        assert_eq!(next_now(&mut to_server), None);
        drop(to_server);
        assert!(release.is_closed(), "the hold is dropped with its reader");
        assert_eq!(*script.closed.lock().unwrap(), 0, "the other reader still lives");
        drop(to_client);
        assert_eq!(*script.closed.lock().unwrap(), 1);
        release.closed().await;
    }
}
