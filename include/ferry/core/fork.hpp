// Fork children: what a process inherits from its parent (memory, no threads) and must not act on.
#pragma once

#include <cstdint>

namespace ferry {

/// How many times this process's line of ancestors has forked since ferry was loaded: 0 in the process
/// that loaded ferry, bumped in every fork child (pthread_atfork). An object that records the value at
/// its creation knows, when the value differs, that it is a copy in a fork child: its threads do not
/// exist there, and a lock one of them held at the fork stays held forever, so it must not be used.
/// Lock-free; safe in a fork child and in any thread.
[[nodiscard]] std::uint64_t fork_generation() noexcept;

}  // namespace ferry
