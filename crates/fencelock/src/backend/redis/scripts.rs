//! dlock's Lua scripts, listed once: each is built (and its SHA-1 computed) once per
//! client, loaded at connect, and sent by SHA (`EVALSHA`, reloaded on `NOSCRIPT`).
//! Each file in `lua/` carries its KEYS / ARGV / returns header. The scripts of primitives
//! that wake one waiter per release include `lua/queue.lua`, the waiter queue's
//! functions, written once: first, or (the plain lock's, whose uncontended path must be
//! cheapest) after that fast path, so that an uncontended call does not define them.
//! Every script that mints fences (or a semaphore's hand-over counter) starts with
//! `lua/fence.lua` and passes [`LockKeys::legacy_fence`](crate::keys::LockKeys::legacy_fence)
//! as its last key: a counter that the key layout moved starts above its old value.

use redis::Script;

macro_rules! scripts {
    ($($name:ident => $($file:literal)+),* $(,)?) => {
        /// Every script of the backend, one field each.
        pub(super) struct Scripts {
            $(pub(super) $name: Script,)*
        }

        impl Scripts {
            pub(super) fn new() -> Scripts {
                Scripts {
                    $($name: Script::new(concat!($(include_str!(concat!("lua/", $file))),+)),)*
                }
            }

            /// All of them, for loading at connect.
            pub(super) fn all(&self) -> Vec<&Script> {
                vec![$(&self.$name,)*]
            }
        }
    };
}

scripts! {
    acquire => "fence.lua" "acquire.lua" "queue.lua" "acquire_queued.lua",
    release => "fence.lua" "release.lua" "queue.lua" "release_queued.lua",
    release_fast => "release_fast.lua",
    release_member => "release_member.lua",
    extend => "extend.lua",
    sem_acquire => "fence.lua" "queue.lua" "sem_acquire.lua",
    sem_release => "fence.lua" "queue.lua" "sem_release.lua",
    sem_extend => "sem_extend.lua",
    sem_count => "sem_count.lua",
    sem_add => "fence.lua" "queue.lua" "sem_add.lua",
    re_acquire => "fence.lua" "queue.lua" "re_acquire.lua",
    re_release => "fence.lua" "queue.lua" "re_release.lua",
    re_extend => "re_extend.lua",
    rw_acquire => "fence.lua" "rw_acquire.lua",
    rw_release => "rw_release.lua",
    rw_extend => "rw_extend.lua",
    rw_downgrade => "rw_downgrade.lua",
    rw_abandon => "rw_abandon.lua",
    fair_acquire => "fence.lua" "fair_acquire.lua",
    fair_release => "fair_release.lua",
    elect_publish => "elect_publish.lua",
}
