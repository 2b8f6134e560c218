//! The server against real sockets and the `toxiproxy_rust` client (compatibility with other
//! Toxiproxy clients is proven here).

use super::*;
use serde_json::{Value, json};
use std::io::ErrorKind;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use toxiproxy_rust::client::Client;
use toxiproxy_rust::proxy::ProxyPack;

/// Failure guard for waits that should end much sooner; not a timing assertion.
const GUARD: Duration = Duration::from_secs(5);

async fn start_server() -> ProxyServer {
    ProxyServer::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("proxy API starts")
}

/// An upstream that greets each connection with `tag`, then echoes, so that tests can tell
/// which upstream a proxied connection reached.
async fn upstream(tag: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("upstream address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                if socket.write_all(tag.as_bytes()).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if socket.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Runs a blocking `toxiproxy_rust` call off the runtime; its reqwest client is created and
/// dropped inside, as blocking reqwest must not be dropped on an async thread.
async fn with_client<T: Send + 'static>(
    api: SocketAddr,
    call: impl FnOnce(&Client) -> T + Send + 'static,
) -> T {
    tokio::task::spawn_blocking(move || call(&Client::new(api)))
        .await
        .expect("client call")
}

async fn populate_one(api: SocketAddr, name: &str, upstream: SocketAddr) -> SocketAddr {
    let pack = ProxyPack::new(name.to_owned(), "127.0.0.1:0".into(), upstream.to_string());
    let proxies = with_client(api, move |client| client.populate(vec![pack]))
        .await
        .expect("populate");
    assert_eq!(proxies.len(), 1);
    let listen: SocketAddr = proxies[0]
        .proxy_pack
        .listen
        .parse()
        .expect("concrete listen");
    assert_ne!(listen.port(), 0);
    listen
}

/// Raw HTTP, to see status codes and bodies exactly as sent.
async fn http(api: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut socket = TcpStream::connect(api).await.expect("connect to API");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket
        .write_all(request.as_bytes())
        .await
        .expect("send request");
    let mut raw = Vec::new();
    tokio::time::timeout(GUARD, socket.read_to_end(&mut raw))
        .await
        .expect("response in time")
        .expect("read response");
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status code");
    (status, body.to_owned())
}

async fn http_json(api: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, body) = http(api, method, path, body).await;
    let value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&body).expect("JSON body")
    };
    (status, value)
}

async fn assert_error(
    api: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    status: u16,
) -> String {
    let (got, value) = http_json(api, method, path, body).await;
    assert_eq!(got, status, "{method} {path} {body}: {value}");
    assert_eq!(value["status"], json!(status));
    value["error"].as_str().expect("error message").to_owned()
}

/// Connects through a proxy and checks which upstream answered.
async fn connect(addr: SocketAddr, tag: &str) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.expect("connect to proxy");
    let mut greeting = vec![0u8; tag.len()];
    tokio::time::timeout(GUARD, conn.read_exact(&mut greeting))
        .await
        .expect("greeting in time")
        .expect("greeting");
    assert_eq!(greeting, tag.as_bytes());
    conn
}

async fn round_trip(conn: &mut TcpStream, message: &[u8]) -> Duration {
    let started = Instant::now();
    conn.write_all(message).await.expect("send");
    let mut echoed = vec![0u8; message.len()];
    tokio::time::timeout(GUARD, conn.read_exact(&mut echoed))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(echoed, message);
    started.elapsed()
}

async fn assert_closed(conn: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(GUARD, conn.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(n)) => panic!("expected a closed connection, got {n} bytes"),
        Err(_) => panic!("connection still open"),
    }
}

async fn assert_refused(addr: SocketAddr) {
    let attempt = tokio::time::timeout(GUARD, TcpStream::connect(addr))
        .await
        .expect("connect fails fast");
    match attempt {
        Err(err) => assert_eq!(err.kind(), ErrorKind::ConnectionRefused),
        Ok(_) => panic!("{addr} still accepts connections"),
    }
}

#[tokio::test]
async fn populate_passes_bytes_and_lists_toxics_as_toxiproxy_rust_reads_them() {
    fn send_sync<T: Send + Sync>() {
        // Nothing to run: it compiles only if the server can be shared across threads.
    }
    send_sync::<ProxyServer>();
    let server = start_server().await;
    let api = server.addr();
    assert_eq!(server.url(), format!("http://{api}"));
    let listen = populate_one(api, "echo", upstream("").await).await;

    let mut conn = connect(listen, "").await;
    round_trip(&mut conn, b"hello through the proxy").await;

    let version = with_client(api, |client| client.version()).await;
    assert_eq!(version.as_deref(), Ok(VERSION));

    with_client(api, |client| {
        let proxy = client.find_proxy("echo").expect("find proxy");
        proxy.with_latency("upstream".into(), 10, 5, 1.0);
        proxy.with_slicer("downstream".into(), 64, 8, 10, 0.5);
        proxy.with_bandwidth("downstream".into(), 1000, 1.0);
    })
    .await;
    // The live connection keeps working with the new toxics.
    round_trip(&mut conn, &[7u8; 300]).await;

    let all = with_client(api, |client| client.all())
        .await
        .expect("all proxies");
    let pack = &all["echo"].proxy_pack;
    assert_eq!(pack.name, "echo");
    assert_eq!(pack.listen, listen.to_string());
    assert!(pack.enabled);
    // What toxiproxy_rust deserialized, written back out for an exact comparison.
    let toxics = serde_json::to_value(&pack.toxics).expect("toxics as JSON");
    assert_eq!(
        toxics,
        json!([
            {"name": "latency_upstream", "type": "latency", "stream": "upstream",
             "toxicity": 1.0, "attributes": {"latency": 10, "jitter": 5}},
            {"name": "slicer_downstream", "type": "slicer", "stream": "downstream",
             "toxicity": 0.5,
             "attributes": {"average_size": 64, "size_variation": 8, "delay": 10}},
            {"name": "bandwidth_downstream", "type": "bandwidth", "stream": "downstream",
             "toxicity": 1.0, "attributes": {"rate": 1000}},
        ])
    );
    let listed = with_client(api, |client| client.find_proxy("echo")?.toxics())
        .await
        .expect("toxics of echo");
    assert_eq!(listed.len(), 3);
    server.shutdown().await;
}

#[tokio::test]
async fn latency_toxic_delays_live_and_new_connections() {
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "slow", upstream("").await).await;
    let mut live = connect(listen, "").await;
    round_trip(&mut live, b"before").await;

    with_client(api, |client| {
        client.find_proxy("slow").expect("find proxy").with_latency(
            "downstream".into(),
            300,
            0,
            1.0,
        );
    })
    .await;
    assert!(round_trip(&mut live, b"live").await >= Duration::from_millis(300));
    let mut fresh = connect(listen, "").await;
    assert!(round_trip(&mut fresh, b"fresh").await >= Duration::from_millis(300));

    let (status, _) = http(api, "DELETE", "/proxies/slow/toxics/latency_downstream", "").await;
    assert_eq!(status, 204);
    round_trip(&mut live, b"after").await;
}

#[tokio::test]
async fn timeout_toxic_stops_data_and_updates_merge_attributes() {
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "stall", upstream("").await).await;

    let (status, created) = http_json(
        api,
        "POST",
        "/proxies/stall/toxics",
        r#"{"type":"timeout","attributes":{"timeout":0}}"#,
    )
    .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(
        created,
        json!({"name": "timeout_downstream", "type": "timeout", "stream": "downstream",
               "toxicity": 1.0, "attributes": {"timeout": 0}})
    );

    let mut conn = connect(listen, "").await;
    conn.write_all(b"anyone there?").await.expect("send");
    let mut buf = [0u8; 64];
    let silent = tokio::time::timeout(Duration::from_millis(400), conn.read(&mut buf)).await;
    assert!(silent.is_err(), "data passed a timeout toxic: {silent:?}");

    // With a timeout the toxic closes the connection; the update reaches the live one.
    let (status, updated) = http_json(
        api,
        "POST",
        "/proxies/stall/toxics/timeout_downstream",
        r#"{"attributes":{"timeout":100}}"#,
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["attributes"], json!({"timeout": 100}));
    assert_closed(&mut conn).await;

    let (status, updated) = http_json(
        api,
        "POST",
        "/proxies/stall/toxics/timeout_downstream",
        r#"{"toxicity":0.5}"#,
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    let (_, shown) = http_json(api, "GET", "/proxies/stall/toxics/timeout_downstream", "").await;
    assert_eq!(shown["attributes"], json!({"timeout": 100}));
    assert_eq!(shown["toxicity"], json!(0.5));
}

/// Reads once: a reset must surface as ECONNRESET, never as data or an orderly EOF.
async fn assert_reset(conn: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(GUARD, conn.read(&mut buf)).await {
        Err(_) => panic!("connection neither reset nor closed"),
        Ok(Err(err)) => assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}"),
        Ok(Ok(0)) => panic!("connection closed with a FIN, expected a reset"),
        Ok(Ok(n)) => panic!("{n} bytes passed a reset_peer toxic"),
    }
}

#[tokio::test]
async fn reset_peer_toxic_resets_live_and_new_connections_once_data_flows() {
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "rst", upstream("hi").await).await;
    let mut live = connect(listen, "hi").await;

    let (status, created) = http_json(
        api,
        "POST",
        "/proxies/rst/toxics",
        r#"{"type":"reset_peer","stream":"upstream","attributes":{"timeout":150}}"#,
    )
    .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(
        created,
        json!({"name": "reset_peer_upstream", "type": "reset_peer", "stream": "upstream",
               "toxicity": 1.0, "attributes": {"timeout": 150}})
    );

    // A live connection is reset once it sends, after the toxic's timeout.
    let started = Instant::now();
    live.write_all(b"PING").await.expect("send");
    assert_reset(&mut live).await;
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "reset before the timeout: {:?}",
        started.elapsed()
    );

    // A new connection is accepted (the greeting flows downstream, untouched), then reset
    // on its first upstream byte.
    let mut fresh = connect(listen, "hi").await;
    fresh.write_all(b"PING").await.expect("send");
    assert_reset(&mut fresh).await;

    // Removed, the proxy passes data again, and a normal close is a FIN again.
    let (status, _) = http(api, "DELETE", "/proxies/rst/toxics/reset_peer_upstream", "").await;
    assert_eq!(status, 204);
    let mut healed = connect(listen, "hi").await;
    round_trip(&mut healed, b"PING").await;
    healed.shutdown().await.expect("half-close");
    let mut buf = [0u8; 8];
    let end = tokio::time::timeout(GUARD, healed.read(&mut buf)).await;
    assert!(matches!(end, Ok(Ok(0))), "expected a FIN, got {end:?}");
}

#[tokio::test]
async fn bytes_held_by_a_latency_toxic_reach_the_client_when_the_server_closes() {
    // A server that answers and closes at once, as an HTTP server with `Connection: close`.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let upstream = listener.local_addr().expect("upstream address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"the whole reply").await;
            drop(socket);
        }
    });
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "late", upstream).await;
    let (status, _) = http(
        api,
        "POST",
        "/proxies/late/toxics",
        r#"{"type":"latency","attributes":{"latency":200}}"#,
    )
    .await;
    assert_eq!(status, 200);

    let started = Instant::now();
    let mut conn = TcpStream::connect(listen).await.expect("connect");
    let mut reply = Vec::new();
    tokio::time::timeout(GUARD, conn.read_to_end(&mut reply))
        .await
        .expect("closed in time")
        .expect("read to the end");
    assert_eq!(reply, b"the whole reply");
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn bandwidth_toxic_paces_large_chunks() {
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "thin", upstream("").await).await;
    let (status, body) = http(
        api,
        "POST",
        "/proxies/thin/toxics",
        r#"{"type":"bandwidth","attributes":{"rate":4}}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut conn = connect(listen, "").await;
    // 1200 bytes at 4 KB/s take 300 ms; unpaced, noxious would stall or drop this chunk.
    assert!(round_trip(&mut conn, &[1u8; 1200]).await >= Duration::from_millis(250));
}

#[tokio::test]
async fn disable_refuses_and_closes_then_enable_rebinds_the_same_port() {
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "flaky", upstream("").await).await;
    let mut live = connect(listen, "").await;
    round_trip(&mut live, b"up").await;
    with_client(api, |client| {
        client
            .find_proxy("flaky")
            .expect("find proxy")
            .with_latency("downstream".into(), 1, 0, 1.0);
    })
    .await;

    with_client(api, |client| client.find_proxy("flaky")?.disable())
        .await
        .expect("disable");
    assert_closed(&mut live).await;
    assert_refused(listen).await;
    let (_, shown) = http_json(api, "GET", "/proxies/flaky", "").await;
    assert_eq!(shown["enabled"], json!(false));
    assert_eq!(shown["toxics"][0]["name"], json!("latency_downstream"));

    with_client(api, |client| client.find_proxy("flaky")?.enable())
        .await
        .expect("enable");
    let mut again = connect(listen, "").await;
    round_trip(&mut again, b"back").await;
    let (_, shown) = http_json(api, "GET", "/proxies/flaky", "").await;
    assert_eq!(shown["enabled"], json!(true));
    assert_eq!(shown["listen"], json!(listen.to_string()));
}

/// A proxy's port held by someone else when it comes back: a moment's hold (the last run's
/// listener not yet freed) is waited out and the proxy binds the same port; a hold that lasts is
/// an error naming the port, and the proxy shows as disabled.
#[tokio::test]
async fn enable_waits_out_a_moment_of_its_port_in_use_and_reports_a_lasting_one() {
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "held", upstream("").await).await;
    for (hold, comes_back) in [(Duration::from_millis(300), true), (GUARD, false)] {
        with_client(api, |client| client.find_proxy("held")?.disable())
            .await
            .expect("disable");
        let squatter = std::net::TcpListener::bind(listen).expect("the port is free");
        let release = tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            drop(squatter);
        });
        let (status, body) = http(api, "POST", "/proxies/held", r#"{"enabled":true}"#).await;
        if comes_back {
            assert_eq!(status, 200, "{body}");
            let mut conn = connect(listen, "").await;
            round_trip(&mut conn, b"back").await;
        } else {
            assert!(status >= 500, "{status} {body}");
            assert!(
                body.contains(&listen.to_string()) && body.contains("still, after"),
                "{body}"
            );
            let (_, shown) = http_json(api, "GET", "/proxies/held", "").await;
            assert_eq!(shown["enabled"], json!(false));
        }
        release.await.expect("release");
    }
}

#[tokio::test]
async fn api_errors_have_toxiproxy_status_codes() {
    let server = start_server().await;
    let api = server.addr();
    let up = upstream("").await;

    assert_eq!(
        assert_error(api, "GET", "/proxies/nope", "", 404).await,
        "proxy not found"
    );
    assert_error(
        api,
        "POST",
        "/proxies/nope/toxics",
        r#"{"type":"latency"}"#,
        404,
    )
    .await;
    assert_error(api, "DELETE", "/proxies/nope", "", 404).await;
    assert_error(api, "GET", "/no/such/route", "", 404).await;

    let create = format!(r#"{{"name":"p","upstream":"{up}","listen":"127.0.0.1:0"}}"#);
    let (status, created) = http_json(api, "POST", "/proxies", &create).await;
    assert_eq!(status, 201, "{created}");
    assert_ne!(created["listen"], json!("127.0.0.1:0"));
    assert_eq!(
        assert_error(api, "POST", "/proxies", &create, 409).await,
        "proxy already exists"
    );
    assert_error(api, "POST", "/proxies", r#"{"name":"q"}"#, 400).await;
    assert_error(api, "POST", "/populate", r#"{"name":"q"}"#, 400).await;

    let latency = r#"{"type":"latency","attributes":{"latency":5}}"#;
    let (status, _) = http(api, "POST", "/proxies/p/toxics", latency).await;
    assert_eq!(status, 200);
    assert_eq!(
        assert_error(api, "POST", "/proxies/p/toxics", latency, 409).await,
        "toxic already exists"
    );
    assert_eq!(
        assert_error(api, "POST", "/proxies/p/toxics", r#"{"type":"bogus"}"#, 400).await,
        "unsupported toxic type bogus"
    );
    for bad in [
        r#"{"type":"latency","name":"l2","attributes":{"latency":"slow"}}"#,
        r#"{"type":"latency","name":"l3","attributes":{"latency":-1}}"#,
        r#"{"type":"latency","name":"l4","attributes":{"latency":10,"jitter":20}}"#,
        r#"{"type":"slicer","attributes":{"average_size":0}}"#,
        r#"{"type":"slicer","attributes":{"average_size":10,"size_variation":10}}"#,
        r#"{"type":"timeout","stream":"sideways"}"#,
        r#"{"type":"timeout","toxicity":"high"}"#,
        r#"{"type":"timeout""#,
        "[]",
    ] {
        assert_error(api, "POST", "/proxies/p/toxics", bad, 400).await;
    }
    assert_error(
        api,
        "POST",
        "/proxies/p/toxics/latency_downstream",
        r#"{"attributes":{"latency":true}}"#,
        400,
    )
    .await;
    assert_error(api, "GET", "/proxies/p/toxics/nope", "", 404).await;
    assert_error(api, "POST", "/proxies/p/toxics/nope", "{}", 404).await;
    assert_error(api, "DELETE", "/proxies/p/toxics/nope", "", 404).await;
    assert_error(api, "POST", "/proxies/p", r#"{"enabled":"yes"}"#, 400).await;

    let (status, _) = http(api, "DELETE", "/proxies/p/toxics/latency_downstream", "").await;
    assert_eq!(status, 204);
    let (status, _) = http(api, "DELETE", "/proxies/p", "").await;
    assert_eq!(status, 204);
    assert_error(api, "GET", "/proxies/p", "", 404).await;
}

#[tokio::test]
async fn changing_the_upstream_sends_new_connections_there() {
    let server = start_server().await;
    let api = server.addr();
    let first = upstream("A").await;
    let second = upstream("B").await;
    let listen = populate_one(api, "switch", first).await;
    let _on_first = connect(listen, "A").await;

    let (status, updated) = http_json(
        api,
        "POST",
        "/proxies/switch",
        &format!(r#"{{"upstream":"{second}"}}"#),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["upstream"], json!(second.to_string()));
    assert_eq!(updated["listen"], json!(listen.to_string()));
    let mut conn = connect(listen, "B").await;
    round_trip(&mut conn, b"second").await;
}

#[tokio::test]
async fn reset_removes_toxics_and_enables_all_and_populate_keeps_unchanged_proxies() {
    let server = start_server().await;
    let api = server.addr();
    let up = upstream("").await;
    let one = populate_one(api, "one", up).await;
    let two = populate_one(api, "two", up).await;
    with_client(api, |client| {
        let proxy = client.find_proxy("one").expect("find one");
        proxy.with_timeout("upstream".into(), 0, 1.0);
        proxy.with_latency("downstream".into(), 5, 0, 1.0);
        client.find_proxy("two").expect("find two").disable()
    })
    .await
    .expect("disable two");

    // Populating the same address and upstream keeps the proxy and its toxics.
    let same = ProxyPack::new("one".into(), one.to_string(), up.to_string());
    let kept = with_client(api, move |client| client.populate(vec![same]))
        .await
        .expect("populate unchanged");
    assert_eq!(kept[0].proxy_pack.toxics.len(), 2);

    with_client(api, |client| client.reset())
        .await
        .expect("reset");
    let (status, _) = http(api, "POST", "/reset", "").await;
    assert_eq!(status, 204);
    let all = with_client(api, |client| client.all()).await.expect("all");
    for name in ["one", "two"] {
        assert!(all[name].proxy_pack.enabled, "{name} enabled");
        assert!(all[name].proxy_pack.toxics.is_empty(), "{name} toxics");
    }
    round_trip(&mut connect(one, "").await, b"one").await;
    round_trip(&mut connect(two, "").await, b"two").await;

    // A changed upstream replaces the proxy.
    let other = upstream("X").await;
    let changed = ProxyPack::new("two".into(), "127.0.0.1:0".into(), other.to_string());
    let replaced = with_client(api, move |client| client.populate(vec![changed]))
        .await
        .expect("populate changed");
    let listen: SocketAddr = replaced[0].proxy_pack.listen.parse().expect("listen");
    connect(listen, "X").await;
}

#[tokio::test]
async fn shutdown_stops_the_api_and_every_proxy() {
    let server = start_server().await;
    let api = server.addr();
    let listen = populate_one(api, "gone", upstream("").await).await;
    let mut live = connect(listen, "").await;
    round_trip(&mut live, b"alive").await;

    server.shutdown().await;
    assert_refused(api).await;
    assert_refused(listen).await;
    assert_closed(&mut live).await;
}

#[tokio::test]
async fn drop_stops_every_proxy() {
    let server = start_server().await;
    let listen = populate_one(server.addr(), "dropped", upstream("").await).await;
    drop(server);
    let deadline = Instant::now() + GUARD;
    while TcpStream::connect(listen).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "proxy still listening after drop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn serve_runs_until_its_shutdown_future() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let api = probe.local_addr().expect("probe address");
    drop(probe);
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(serve(api, async move {
        let _ = stopped.await;
    }));
    let deadline = Instant::now() + GUARD;
    let (status, body) = loop {
        if TcpStream::connect(api).await.is_ok() {
            break http(api, "GET", "/version", "").await;
        }
        assert!(Instant::now() < deadline, "API never came up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((status, body.as_str()), (200, VERSION));
    let listen = populate_one(api, "served", upstream("").await).await;

    let _ = stop.send(());
    let result = tokio::time::timeout(GUARD, serving)
        .await
        .expect("serve returns")
        .expect("serve task");
    assert!(result.is_ok());
    assert_refused(listen).await;
}
