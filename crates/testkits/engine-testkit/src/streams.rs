//! Reading a request's stream to its end (for any executor's tests).

use engine::{Event, RequestStream};

/// A request's tokens and its terminal event (`Finished` or `Failed`),
/// checking that nothing follows the terminal event.
pub async fn collect(mut stream: RequestStream) -> (Vec<u32>, Event) {
    let mut tokens = Vec::new();
    loop {
        match stream
            .next()
            .await
            .expect("a terminal event before the end")
        {
            Event::Token(t) => tokens.push(t.token),
            terminal => {
                assert!(
                    stream.next().await.is_none(),
                    "events after the terminal one"
                );
                return (tokens, terminal);
            }
        }
    }
}

/// The tokens of each stream, in order, each request having finished
/// (panics on a failed one).
pub async fn finished_tokens(streams: Vec<RequestStream>) -> Vec<Vec<u32>> {
    let mut all = Vec::with_capacity(streams.len());
    for stream in streams {
        let (tokens, end) = collect(stream).await;
        assert!(
            matches!(end, Event::Finished { .. }),
            "request failed: {end:?}"
        );
        all.push(tokens);
    }
    all
}
