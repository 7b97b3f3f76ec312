//! The worker pool: a set of threads serving one LIFO stack of tasks (fixed,
//! or grown once to a count known only after the run began).
//!
//! Workers block on a condition variable when the stack is empty (no timer,
//! no polling, no spinning) and the pool ends when the stack is empty and no
//! worker is running a task (a running task may still push more). LIFO keeps
//! the traversal depth-first, so a directory's copies run before the next
//! directories are listed and memory stays bounded by the directories in
//! flight, not by the tree (the lesson of ripgrep's walker).
//! Wake-ups are only signalled when some worker is actually waiting, so a
//! busy pool costs one uncontended lock per push and pop, no syscall.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A stack of tasks shared by the workers.
pub struct Pool<T> {
    state: Mutex<State<T>>,
    cv: Condvar,
}

struct State<T> {
    stack: Vec<T>,
    running: usize,
    waiting: usize,
    stop: bool,
}

impl<T: Send> Pool<T> {
    /// An empty pool.
    pub fn new() -> Pool<T> {
        Pool {
            state: Mutex::new(State {
                stack: Vec::new(),
                running: 0,
                waiting: 0,
                stop: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// Add a task.
    pub fn push(&self, task: T) {
        let mut s = self.state.lock();
        s.stack.push(task);
        if s.waiting > 0 {
            self.cv.notify_one();
        }
    }

    /// Add several tasks at once (the last one runs first).
    pub fn push_all(&self, tasks: impl IntoIterator<Item = T>) {
        let mut s = self.state.lock();
        let before = s.stack.len();
        s.stack.extend(tasks);
        let added = s.stack.len() - before;
        if s.waiting > 0 && added > 0 {
            if added == 1 {
                self.cv.notify_one();
            } else {
                self.cv.notify_all();
            }
        }
    }

    /// Drop all queued tasks and make the workers return (cancellation).
    pub fn stop(&self) {
        let mut s = self.state.lock();
        s.stop = true;
        s.stack.clear();
        self.cv.notify_all();
    }

    /// Run `workers` threads until no task is left; `f` runs one task and may
    /// push more through the pool reference it gets.
    pub fn run<F>(&self, workers: usize, f: F)
    where
        F: Fn(T, &Pool<T>) + Sync,
    {
        self.run_growing(workers, None, f)
    }

    /// [`Pool::run`] on `workers` threads, and on up to as many as `more`
    /// says once it says it: asked (it must not block) each time a worker
    /// takes a task, until it answers; from then on, a worker that takes a
    /// task while more are queued than workers wait starts as many more as
    /// are queued, up to that count. A count known only once the run has
    /// begun (a remote link's round trip, measured while the first tasks
    /// run) takes effect then, without holding the first tasks back for
    /// it, and threads are started only for work that waits for one.
    pub fn run_growing<F>(
        &self,
        workers: usize,
        more: Option<&(dyn Fn() -> Option<usize> + Sync)>,
        f: F,
    ) where
        F: Fn(T, &Pool<T>) + Sync,
    {
        let workers = workers.max(1);
        // The count to grow to (0: not known yet), and the threads started.
        let target = AtomicUsize::new(if more.is_none() { workers } else { 0 });
        let started = AtomicUsize::new(workers);
        std::thread::scope(|scope| {
            let (f, target, started) = (&f, &target, &started);
            let grow = move |queued: usize, idle: usize| {
                let n = match target.load(Ordering::Relaxed) {
                    0 => match more.and_then(|m| m()) {
                        Some(n) => {
                            target.store(n.max(1), Ordering::Relaxed);
                            n.max(1)
                        }
                        None => return,
                    },
                    n => n,
                };
                let have = started.load(Ordering::Relaxed);
                if have >= n || queued <= idle {
                    return;
                }
                let k = (n - have).min(queued - idle);
                if started
                    .compare_exchange(have, have + k, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    for _ in 0..k {
                        scope.spawn(move || self.work(f, &|_, _| ()));
                    }
                }
            };
            for _ in 0..workers {
                scope.spawn(move || self.work(f, &grow));
            }
        });
    }

    fn work<F: Fn(T, &Pool<T>)>(&self, f: &F, grow: &dyn Fn(usize, usize)) {
        let mut s = self.state.lock();
        loop {
            if s.stop {
                return;
            }
            if let Some(task) = s.stack.pop() {
                s.running += 1;
                let (queued, idle) = (s.stack.len(), s.waiting);
                drop(s);
                grow(queued, idle);
                // A panicking task must not leave `running` raised forever,
                // or the other workers would wait for it.
                let guard = RunningGuard(self);
                f(task, self);
                std::mem::forget(guard);
                s = self.state.lock();
                s.running -= 1;
                if s.running == 0 && s.stack.is_empty() && s.waiting > 0 {
                    self.cv.notify_all();
                }
                continue;
            }
            if s.running == 0 {
                return;
            }
            s.waiting += 1;
            self.cv.wait(&mut s);
            s.waiting -= 1;
        }
    }
}

impl<T: Send> Default for Pool<T> {
    fn default() -> Self {
        Pool::new()
    }
}

struct RunningGuard<'a, T>(&'a Pool<T>);

impl<T> Drop for RunningGuard<'_, T> {
    fn drop(&mut self) {
        // Only reached when the task panicked: stop everything.
        {
            let mut s = self.0.state.lock();
            s.running -= 1;
            s.stop = true;
            self.0.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_every_task_including_pushed_ones() {
        let pool = Pool::new();
        let done = AtomicUsize::new(0);
        pool.push(0u32);
        pool.run(4, |depth, p| {
            done.fetch_add(1, Ordering::Relaxed);
            if depth < 10 {
                p.push_all([depth + 1, depth + 1]);
            }
        });
        assert_eq!(done.load(Ordering::Relaxed), (1 << 11) - 1);
    }

    /// Four tasks that each wait for all four to run at once: one worker
    /// cannot run them, the four it grows to once `more` answers do.
    #[test]
    fn grows_to_the_count_given_later() {
        use std::time::{Duration, Instant};
        let pool = Pool::new();
        // (The last runs first.)
        pool.push_all([0u32, 1, 2, 3, 100]);
        let asked = AtomicUsize::new(0);
        // Not known when the first task is taken: known the next time.
        let more = || (asked.fetch_add(1, Ordering::Relaxed) > 0).then_some(4);
        let at_once = (Mutex::new(0usize), Condvar::new());
        let met = AtomicUsize::new(0);
        pool.run_growing(1, Some(&more), |t, _| {
            if t == 100 {
                // The first task: the next one taken asks `more` again.
                return;
            }
            let (n, cv) = &at_once;
            let mut n = n.lock();
            *n += 1;
            cv.notify_all();
            let deadline = Instant::now() + Duration::from_secs(10);
            while *n < 4 && Instant::now() < deadline {
                cv.wait_for(&mut n, Duration::from_millis(50));
            }
            if *n >= 4 {
                met.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(met.load(Ordering::Relaxed), 4, "4 tasks ran at once");
    }

    #[test]
    fn empty_pool_returns() {
        let pool: Pool<u32> = Pool::new();
        pool.run(3, |_, _| unreachable!());
    }
}
