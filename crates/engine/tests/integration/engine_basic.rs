use crate::common;

use common::*;
use engine_testkit::collect;

#[tokio::test]
async fn concurrent_requests_get_their_reference_tokens() {
    let s = start(config(64, 8), geometry(8, 64, 4));
    let requests: Vec<_> = (0..6)
        .map(|i| {
            request(
                prompt(i, 5 + 7 * i as usize),
                10 + i as usize,
                100 + i as u64,
            )
        })
        .collect();
    let streams: Vec<_> = requests
        .iter()
        .map(|r| s.handle.submit(r.clone()).expect("accepted"))
        .collect();
    for (r, stream) in requests.iter().zip(streams) {
        let (tokens, end) = collect(stream).await;
        assert_eq!(tokens, reference_tokens(r, &[EOS]));
        finished_length(&end, r.prompt.len(), r.stop.max_tokens);
    }
    assert!(
        s.control.violations().is_empty(),
        "{:?}",
        s.control.violations()
    );
    wait_released(&s.handle);
}
