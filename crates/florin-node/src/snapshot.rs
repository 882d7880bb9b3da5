//! A value that is costly to ask for (a round of RPCs to every replica or custody node), shared
//! by every caller: a caller gets the last answer at once when it is fresh, or when another
//! caller is already asking; only one caller at a time asks, and nobody waits on the lock while
//! it does. So no rate of callers makes the process ask more than once per freshness window,
//! nor ties up its threads waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The last answer and whether someone is asking.
pub struct Snapshot<T> {
    fresh_for: Duration,
    last: Mutex<Option<(Instant, T)>>,
    asking: AtomicBool,
}

impl<T: Clone> Snapshot<T> {
    /// Answers reused for `fresh_for`.
    pub fn new(fresh_for: Duration) -> Snapshot<T> {
        Snapshot {
            fresh_for,
            last: Mutex::new(None),
            asking: AtomicBool::new(false),
        }
    }

    fn read(&self) -> Option<(Instant, T)> {
        match self.last.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The last answer when fresh; else this caller asks (`ask`, blocking) unless another
    /// is asking, in which case it gets the last answer, however old, or `None` before the
    /// first.
    pub fn get(&self, ask: impl FnOnce() -> T) -> Option<T> {
        let last = self.read();
        if let Some((at, v)) = &last {
            if at.elapsed() < self.fresh_for {
                return Some(v.clone());
            }
        }
        if self
            .asking
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return last.map(|(_, v)| v);
        }
        // Cleared however `ask` ends (a panic included), so a later caller asks again.
        struct Clear<'a>(&'a AtomicBool);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _clear = Clear(&self.asking);
        let v = ask();
        match self.last.lock() {
            Ok(mut l) => *l = Some((Instant::now(), v.clone())),
            Err(p) => *p.into_inner() = Some((Instant::now(), v.clone())),
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn one_caller_asks_the_others_get_the_last_answer_at_once() {
        let snap = Arc::new(Snapshot::<u64>::new(Duration::from_secs(60)));
        let asked = Arc::new(AtomicUsize::new(0));
        // Nobody asked yet, and one is asking (slowly): the others get nothing, at once.
        let slow = {
            let (snap, asked) = (snap.clone(), asked.clone());
            std::thread::spawn(move || {
                snap.get(|| {
                    asked.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(300));
                    7
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        assert_eq!(snap.get(|| unreachable!("another caller is asking")), None);
        assert!(started.elapsed() < Duration::from_millis(200));
        assert_eq!(slow.join().ok().flatten(), Some(7));
        // Fresh: reused without asking.
        assert_eq!(snap.get(|| unreachable!("fresh")), Some(7));
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_stale_answer_is_asked_again() {
        let snap = Snapshot::<u64>::new(Duration::from_millis(0));
        assert_eq!(snap.get(|| 1), Some(1));
        assert_eq!(snap.get(|| 2), Some(2));
    }
}
