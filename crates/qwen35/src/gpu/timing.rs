//! Step timing for the request timeline (off unless asked for): when the
//! forward's launch began and ended on the host, and from CUDA events
//! around it, how long the forward ran on the device and how long the
//! caller's work after it (sampling, copies back) took until it returned.
//! Reading the events waits for them: a step that samples nothing (and so
//! would return before its forward ends) waits for the device when timed.

use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::DeviceError;

/// The last timed step's stamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardTiming {
    /// The host began queueing the forward (after checks, layout, uploads).
    pub launch_start: Instant,
    /// The host had queued the whole forward.
    pub launch_end: Instant,
    /// The forward on the device (event to event).
    pub forward: Duration,
    /// From the forward's end on the device until the step's `then`
    /// (sampling, copies back) had returned on the host.
    pub after_forward: Duration,
}

/// Timing events, recorded on the model's stream.
pub(crate) struct StepClock {
    forward_start: CudaEvent,
    forward_end: CudaEvent,
    done: CudaEvent,
    launch_start: Option<Instant>,
    launch_end: Option<Instant>,
    pub last: Option<ForwardTiming>,
}

impl StepClock {
    pub fn new(stream: &CudaStream) -> Result<Self, DeviceError> {
        let ctx = stream.context();
        let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        Ok(StepClock {
            forward_start: event()?,
            forward_end: event()?,
            done: event()?,
            launch_start: None,
            launch_end: None,
            last: None,
        })
    }

    /// Before the forward's first kernel is queued.
    pub fn forward_starts(&mut self, stream: &CudaStream) -> Result<(), DeviceError> {
        self.last = None;
        self.launch_start = Some(Instant::now());
        self.forward_start.record(stream)?;
        Ok(())
    }

    /// After the forward's last kernel was queued.
    pub fn forward_queued(&mut self, stream: &CudaStream) -> Result<(), DeviceError> {
        self.forward_end.record(stream)?;
        self.launch_end = Some(Instant::now());
        Ok(())
    }

    /// After the step's `then` returned: reads the events (the stream is
    /// idle by then, or this waits for it).
    pub fn step_done(&mut self, stream: &CudaStream) -> Result<(), DeviceError> {
        self.done.record(stream)?;
        let ms = |a: &CudaEvent, b: &CudaEvent| -> Result<Duration, DeviceError> {
            let ms = a.elapsed_ms(b)?;
            Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
        };
        let (Some(launch_start), Some(launch_end)) =
            (self.launch_start.take(), self.launch_end.take())
        else {
            return Ok(());
        };
        self.last = Some(ForwardTiming {
            launch_start,
            launch_end,
            forward: ms(&self.forward_start, &self.forward_end)?,
            after_forward: ms(&self.forward_end, &self.done)?,
        });
        Ok(())
    }
}
