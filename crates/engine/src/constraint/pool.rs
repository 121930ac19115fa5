//! The mask pool: a few threads that run mask jobs while the engine
//! thread waits on the executor's forward.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct MaskPool {
    /// `None` once dropping (closes the channel so the threads end).
    jobs: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl MaskPool {
    /// `threads` workers (at least one).
    pub(crate) fn new(threads: usize) -> Self {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let inbox = Arc::new(Mutex::new(inbox));
        let threads = (0..threads.max(1))
            .filter_map(|i| {
                let inbox = inbox.clone();
                std::thread::Builder::new()
                    .name(format!("gdn-mask-{i}"))
                    .spawn(move || loop {
                        let job = match inbox.lock() {
                            Ok(inbox) => inbox.recv(),
                            Err(_) => return,
                        };
                        match job {
                            // A job fulfils its mask even when it fails
                            // (step.rs); this keeps the thread alive too.
                            Ok(job) => {
                                let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                            }
                            Err(_) => return,
                        }
                    })
                    .ok()
            })
            .collect();
        MaskPool {
            jobs: Some(jobs),
            threads,
        }
    }

    /// How many threads run jobs (at least one: the caller's own).
    pub(crate) fn width(&self) -> usize {
        self.threads.len().max(1)
    }

    /// Runs `job` on a pool thread (on this one when the pool has none).
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) {
        if self.threads.is_empty() {
            return job();
        }
        if let Some(jobs) = &self.jobs {
            // The threads live as long as the sender: this cannot fail.
            let _ = jobs.send(Box::new(job));
        }
    }
}

impl Drop for MaskPool {
    fn drop(&mut self) {
        self.jobs = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
