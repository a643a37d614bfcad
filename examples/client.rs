//! Run a command on a gateway and copy a file there and back.
//!
//! ```sh
//! exec-gateway serve &                                  # the embedded default
//! EXEC_GATEWAY_TOKEN=$(exec-gateway token --tenant default) \
//!   cargo run --example client -- ws://127.0.0.1:8765
//! ```

use exec_gateway::client::{Client, Event, ProcessSpec, Stream};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "ws://127.0.0.1:8765".to_owned());
    let token = std::env::var("EXEC_GATEWAY_TOKEN")?;
    let client = Client::connect(&url, &token).await?;
    println!("session {} in {}", client.session_id(), client.root());

    let mut spec = ProcessSpec::new("hello", ["sh", "-c", "echo hello; echo oops >&2; exit 3"]);
    spec.env.insert("GREETING".into(), "hi".into());
    client.start(&spec).await?;
    let mut events = client.attach("hello", 0).await?;
    while let Some(event) = events.next().await? {
        match event {
            Event::Output {
                stream: Stream::Stderr,
                data,
                ..
            } => {
                eprint!("{}", String::from_utf8_lossy(&data))
            }
            Event::Output { data, .. } => print!("{}", String::from_utf8_lossy(&data)),
            Event::Exited { code, .. } => println!("exited with {code}"),
            Event::OutputLost { chunks } => eprintln!("{chunks} chunks of output lost"),
        }
    }

    let path = format!(
        "{}/exec-gateway-example.txt",
        client.root().trim_end_matches('/')
    );
    client
        .write_file(&path, b"written by the example\n".to_vec())
        .await?;
    let back = client.read_file(&path).await?;
    println!("read back {} bytes", back.len());
    client.remove(&path, false, true).await?;
    Ok(())
}
