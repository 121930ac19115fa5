//! Open connections within the process's file-descriptor limit: every
//! connection is a descriptor, and a process out of descriptors can accept
//! nothing and open no file. The soft limit is raised to the hard one (as
//! Go's runtime and nginx's `worker_rlimit_nofile` do), and
//! `--limit-concurrency` is lowered to fit under it with room for the rest
//! of the process.

/// Descriptors kept for everything but connections (the listener, model
/// files, the runtime's own, logs).
const RESERVED: u64 = 256;

/// The soft `RLIMIT_NOFILE`, raised to the hard limit where allowed
/// (`None`: unknown, or unlimited).
#[cfg(unix)]
fn raise_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; failure leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    // rlim_t is u64 on Linux, not on every unix.
    #[allow(clippy::unnecessary_cast)]
    let soft = limit.rlim_cur as u64;
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(soft)
}

#[cfg(not(unix))]
fn raise_descriptor_limit() -> Option<u64> {
    None
}

/// `asked` connections, or fewer when the descriptor limit (raised first)
/// leaves room for fewer.
pub fn connections_within_descriptor_limit(asked: usize) -> usize {
    let Some(limit) = raise_descriptor_limit() else {
        return asked;
    };
    let room = limit.saturating_sub(RESERVED).max(1) as usize;
    if asked > room {
        log::warn!(
            "--limit-concurrency {asked} is above what the file-descriptor limit ({limit}, `ulimit -n`) leaves for connections: serving at most {room}"
        );
        return room;
    }
    asked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_under_the_descriptor_limit() {
        let limit = raise_descriptor_limit().expect("a finite limit on Linux");
        let room = (limit - RESERVED) as usize;
        assert_eq!(connections_within_descriptor_limit(10), 10.min(room));
        assert_eq!(connections_within_descriptor_limit(usize::MAX), room);
    }
}
