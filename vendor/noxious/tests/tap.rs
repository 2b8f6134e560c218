//! racecert patch: taps over real loopback sockets (the library's unit tests mock the sockets).
//! A proxy run with a tap forwards bytes unchanged, shows them to the tap in order in both
//! directions, holds client bytes until released, keeps a held chunk across a toxic change, and
//! tears a held connection down when the proxy stops.

use bytes::Bytes;
use futures::FutureExt;
use noxious::proxy::{ProxyConfig, ProxyRunner, Runner, Toxics};
use noxious::signal::{Close, Stop, Stopper};
use noxious::socket::TcpListener as EngineListener;
use noxious::tap::{ConnInfo, ConnTap, Hold, Release, Tap};
use noxious::toxic::{
    StreamDirection, Toxic, ToxicEvent, ToxicEventKind, ToxicEventResult, ToxicKind,
};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// A bound on waits for events that must happen; reaching it fails the test.
const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Open(u64),
    ToServer(Bytes),
    ToClient(Bytes),
    Closed,
}

/// Reports every call on a channel; holds the client chunks that start with `HOLD`.
struct Recorder {
    events: mpsc::UnboundedSender<Seen>,
    holds: Arc<Mutex<Vec<oneshot::Sender<()>>>>,
}

struct ConnRecorder {
    events: mpsc::UnboundedSender<Seen>,
    holds: Arc<Mutex<Vec<oneshot::Sender<()>>>>,
}

impl Tap for Recorder {
    fn open(&self, conn: ConnInfo) -> Arc<dyn ConnTap> {
        let _ = self.events.send(Seen::Open(conn.id));
        Arc::new(ConnRecorder {
            events: self.events.clone(),
            holds: self.holds.clone(),
        })
    }
}

impl ConnTap for ConnRecorder {
    fn to_server(&self, data: &Bytes) -> Option<Hold> {
        let _ = self.events.send(Seen::ToServer(data.clone()));
        let at = data.windows(4).position(|w| w == b"HOLD")?;
        let (release, released) = oneshot::channel();
        self.holds.lock().unwrap().push(release);
        Some(Hold::new(at, released.map(|_| Release::Forward)))
    }
    fn to_client(&self, data: &Bytes) {
        let _ = self.events.send(Seen::ToClient(data.clone()));
    }
    fn closed(&self) {
        let _ = self.events.send(Seen::Closed);
    }
}

struct Bench {
    listen: SocketAddr,
    stopper: Stopper,
    closed: Close,
    events_tx: bmrng::RequestSender<ToxicEvent, ToxicEventResult>,
    seen: mpsc::UnboundedReceiver<Seen>,
    holds: Arc<Mutex<Vec<oneshot::Sender<()>>>>,
    /// Every connection the upstream accepts, as a stream of what it received.
    upstream: mpsc::UnboundedReceiver<mpsc::UnboundedReceiver<Bytes>>,
}

/// An upstream that answers every chunk with `ok:` + the chunk, and reports what it received.
async fn upstream() -> (SocketAddr, mpsc::UnboundedReceiver<mpsc::UnboundedReceiver<Bytes>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (conns_tx, conns) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (got_tx, got) = mpsc::unbounded_channel();
            let _ = conns_tx.send(got);
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let _ = got_tx.send(Bytes::copy_from_slice(&buf[..n]));
                    let mut reply = b"ok:".to_vec();
                    reply.extend_from_slice(&buf[..n]);
                    if socket.write_all(&reply).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, conns)
}

async fn start(toxics: Toxics) -> Bench {
    let (upstream_addr, upstream) = upstream().await;
    let config = ProxyConfig {
        name: "tapped".to_owned(),
        listen: "127.0.0.1:0".to_owned(),
        upstream: upstream_addr.to_string(),
        enabled: true,
        rand_seed: Some(7),
    };
    let (listener, info) = ProxyRunner::initialize_proxy::<EngineListener>(config, toxics)
        .await
        .unwrap();
    let listen = listener.local_addr().unwrap();
    let (events_tx, receiver) = bmrng::channel(1);
    let (stop, stopper) = Stop::new();
    let (closed, closer) = Close::new();
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let holds = Arc::new(Mutex::new(Vec::new()));
    let tap = Arc::new(Recorder {
        events: seen_tx,
        holds: holds.clone(),
    });
    tokio::spawn(ProxyRunner::run_proxy_with_tap(
        listener,
        info,
        receiver,
        stop,
        closer,
        Some(tap),
    ));
    Bench {
        listen,
        stopper,
        closed,
        events_tx,
        seen,
        holds,
        upstream,
    }
}

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(DEADLINE, rx.recv())
        .await
        .expect("event in time")
        .expect("channel open")
}

async fn read_exact(client: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    tokio::time::timeout(DEADLINE, client.read_exact(&mut buf))
        .await
        .expect("reply in time")
        .expect("reply");
    buf
}

#[tokio::test]
async fn bytes_are_forwarded_unchanged_and_seen_in_order_both_ways() {
    let mut bench = start(Toxics::empty()).await;
    let mut client = TcpStream::connect(bench.listen).await.unwrap();
    let Seen::Open(id) = next(&mut bench.seen).await else {
        panic!("open first")
    };
    assert!(id > 0);
    let mut got = next(&mut bench.upstream).await;
    for request in [&b"PING"[..], b"GET k", b"SET k v"] {
        client.write_all(request).await.unwrap();
        assert_eq!(next(&mut got).await, Bytes::copy_from_slice(request));
        let reply = read_exact(&mut client, request.len() + 3).await;
        assert_eq!(reply, [b"ok:", request].concat());
        assert_eq!(
            next(&mut bench.seen).await,
            Seen::ToServer(Bytes::copy_from_slice(request))
        );
        assert_eq!(
            next(&mut bench.seen).await,
            Seen::ToClient(Bytes::from([b"ok:", request].concat()))
        );
    }
    drop(client);
    assert_eq!(next(&mut bench.seen).await, Seen::Closed);
    bench.stopper.stop();
    bench.closed.recv().await.unwrap();
}

#[tokio::test]
async fn a_held_request_reaches_the_server_only_once_released() {
    let mut bench = start(Toxics::empty()).await;
    let mut held = TcpStream::connect(bench.listen).await.unwrap();
    let mut held_got = next(&mut bench.upstream).await;
    let mut free = TcpStream::connect(bench.listen).await.unwrap();
    let mut free_got = next(&mut bench.upstream).await;

    // One write: the bytes before the hold go through at once, the rest waits.
    held.write_all(b"a;HOLD b").await.unwrap();
    assert_eq!(next(&mut held_got).await, Bytes::from_static(b"a;"));
    // Another connection goes through while the first is held.
    free.write_all(b"free").await.unwrap();
    assert_eq!(next(&mut free_got).await, Bytes::from_static(b"free"));
    assert_eq!(read_exact(&mut free, 7).await, b"ok:free");
    assert!(held_got.try_recv().is_err(), "held bytes reached the server");

    let release = bench.holds.lock().unwrap().pop().expect("a hold");
    release.send(()).unwrap();
    assert_eq!(next(&mut held_got).await, Bytes::from_static(b"HOLD b"));
    assert_eq!(read_exact(&mut held, 5 + 9).await, b"ok:a;ok:HOLD b");
    bench.stopper.stop();
    bench.closed.recv().await.unwrap();
}

#[tokio::test]
async fn a_held_chunk_survives_a_toxic_change_and_goes_through_once() {
    let mut bench = start(Toxics::empty()).await;
    let mut client = TcpStream::connect(bench.listen).await.unwrap();
    let mut got = next(&mut bench.upstream).await;
    client.write_all(b"HOLD me").await.unwrap();
    // Wait until the engine has read the chunk (and so holds it).
    loop {
        if let Seen::ToServer(_) = next(&mut bench.seen).await {
            break;
        }
    }
    // Adding a toxic makes the engine rebuild the connection's links.
    let toxic = Toxic {
        name: "slow".to_owned(),
        kind: ToxicKind::Latency {
            latency: 1,
            jitter: 0,
        },
        direction: StreamDirection::Upstream,
        toxicity: 1.0,
    };
    bench
        .events_tx
        .send_receive(ToxicEvent::new(
            "tapped".to_owned(),
            ToxicEventKind::AddToxic(toxic),
        ))
        .await
        .unwrap()
        .unwrap();
    let release = bench.holds.lock().unwrap().pop().expect("a hold");
    release.send(()).unwrap();
    assert_eq!(next(&mut got).await, Bytes::from_static(b"HOLD me"));
    assert_eq!(read_exact(&mut client, 10).await, b"ok:HOLD me");
    client.write_all(b"after").await.unwrap();
    assert_eq!(next(&mut got).await, Bytes::from_static(b"after"));
    bench.stopper.stop();
    bench.closed.recv().await.unwrap();
}

#[tokio::test]
async fn a_held_connection_is_torn_down_when_the_proxy_stops() {
    let mut bench = start(Toxics::empty()).await;
    let mut client = TcpStream::connect(bench.listen).await.unwrap();
    client.write_all(b"HOLD forever").await.unwrap();
    loop {
        if let Seen::ToServer(_) = next(&mut bench.seen).await {
            break;
        }
    }
    let release = bench.holds.lock().unwrap().pop().expect("a hold");
    bench.stopper.stop();
    tokio::time::timeout(DEADLINE, bench.closed.recv())
        .await
        .expect("the proxy stops in time")
        .unwrap();
    assert_eq!(next(&mut bench.seen).await, Seen::Closed);
    assert!(release.is_closed(), "the hold was dropped");
    // The client sees its connection end (EOF or reset), not a wedge.
    let mut buf = [0; 16];
    let end = tokio::time::timeout(DEADLINE, client.read(&mut buf))
        .await
        .expect("the client connection ends in time");
    assert!(matches!(end, Ok(0) | Err(_)), "got {end:?}");
}
