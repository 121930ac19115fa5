//! Drives an `engine::Executor` with hand-built rows, the way the engine's
//! scheduler does: each request owns a fixed slot and page range, feeds its
//! prompt in chunks of `chunk` tokens (sampling after the last one), then
//! one decoded token per step, all requests in the same steps. Used by the
//! CPU and GPU executor tests.

use engine::{
    ExecError, Executor, PageId, SampleSeed, SampleSpec, SampledToken, SamplingParams, SlotId,
    StepRow,
};

/// Greedy tokens of the CPU reference forward on `prompt` alone, `n` of
/// them (the first maximum on a tie): what an engine's greedy run must give.
pub fn cpu_greedy(model: &qwen35::CpuModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut state = model.new_state();
    let mut logits = model.forward(prompt, &mut state).unwrap().pop().unwrap();
    let mut out = vec![];
    for _ in 0..n {
        let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        out.push(best as u32);
        logits = model
            .forward(&[best as u32], &mut state)
            .unwrap()
            .pop()
            .unwrap();
    }
    out
}

/// Greedy, with the chosen token's logprob and the top 5.
pub fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        logprobs: Some(5),
        ..Default::default()
    }
}

pub struct Request {
    pub slot: SlotId,
    pub pages: Vec<PageId>,
    pub prompt: Vec<u32>,
    /// Prompt tokens per step (the last chunk may be shorter).
    pub chunk: usize,
    /// Output tokens to produce.
    pub max_tokens: usize,
    /// Teacher forcing: feed these instead of the sampled tokens (the
    /// samples are still recorded).
    pub forced: Option<Vec<u32>>,
    pub params: SamplingParams,
    /// Prompt then fed outputs.
    pub history: Vec<u32>,
    /// Tokens the slot has seen.
    pub fed: usize,
    pub out: Vec<SampledToken>,
}

impl Request {
    /// Slot `slot`, pages `slot * pages_per_slot..` (disjoint per slot).
    pub fn new(
        slot: u32,
        pages_per_slot: usize,
        prompt: &[u32],
        chunk: usize,
        max_tokens: usize,
    ) -> Request {
        let first = slot as usize * pages_per_slot;
        Request {
            slot: SlotId(slot),
            pages: (first..first + pages_per_slot)
                .map(|p| PageId(p as u32))
                .collect(),
            prompt: prompt.to_vec(),
            chunk,
            max_tokens,
            forced: None,
            params: greedy(),
            history: prompt.to_vec(),
            fed: 0,
            out: vec![],
        }
    }

    pub fn done(&self) -> bool {
        self.out.len() >= self.max_tokens
    }

    pub fn tokens(&self) -> Vec<u32> {
        self.out.iter().map(|t| t.token).collect()
    }
}

/// One step over every unfinished request; returns false when all are done.
pub fn step(exec: &mut dyn Executor, reqs: &mut [Request]) -> Result<bool, ExecError> {
    let live: Vec<usize> = (0..reqs.len()).filter(|&i| !reqs[i].done()).collect();
    if live.is_empty() {
        return Ok(false);
    }
    // (tokens, samples) per live request.
    let plans: Vec<(Vec<u32>, bool)> = live
        .iter()
        .map(|&i| {
            let r = &reqs[i];
            let lo = r.fed;
            let hi = if lo < r.prompt.len() {
                (lo + r.chunk).min(r.prompt.len())
            } else {
                lo + 1
            };
            (r.history[lo..hi].to_vec(), hi >= r.prompt.len())
        })
        .collect();
    let rows: Vec<StepRow> = live
        .iter()
        .zip(&plans)
        .map(|(&i, (tokens, samples))| {
            let r = &reqs[i];
            StepRow {
                snapshots: &[],
                slot: r.slot,
                start: r.fed,
                tokens,
                pages: &r.pages,
                sample: samples.then(|| SampleSpec {
                    params: &r.params,
                    history: &r.history,
                    prompt_len: r.prompt.len(),
                    seed: SampleSeed {
                        seed: 7,
                        draw: r.out.len() as u64,
                    },
                    banned: &[],
                    allowed: None,
                }),
            }
        })
        .collect();
    let sampled = exec.step(&rows)?;
    assert_eq!(
        sampled.len(),
        plans.iter().filter(|p| p.1).count(),
        "one sampled token per sampling row"
    );
    let mut sampled = sampled.into_iter();
    for (&i, (tokens, samples)) in live.iter().zip(plans) {
        let r = &mut reqs[i];
        r.fed += tokens.len();
        if samples {
            let t = sampled.next().expect("counted");
            let next = match &r.forced {
                Some(f) => f[r.out.len()],
                None => t.token,
            };
            r.out.push(t);
            r.history.push(next);
        }
    }
    Ok(true)
}

/// Steps until every request is done.
pub fn run(exec: &mut dyn Executor, reqs: &mut [Request]) {
    while step(exec, reqs).unwrap() {}
}
