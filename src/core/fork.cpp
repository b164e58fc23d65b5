#include "ferry/core/fork.hpp"

#include <pthread.h>

#include <atomic>

namespace ferry {
namespace {
std::atomic<std::uint64_t> g_generation{0};
// Registered when ferry is loaded, before any fork that could copy a ferry object.
[[maybe_unused]] const int g_handler =
    ::pthread_atfork(nullptr, nullptr, [] { g_generation.fetch_add(1, std::memory_order_relaxed); });
}  // namespace

std::uint64_t fork_generation() noexcept { return g_generation.load(std::memory_order_relaxed); }

}  // namespace ferry
