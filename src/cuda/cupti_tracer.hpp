// The cuda backend's recorder: CUPTI's activity API delivering kernels, copies, memsets,
// synchronizations, runtime API calls and NVTX ranges into a trace::recorder, on ferry's host clock.
#pragma once

namespace ferry::trace {
class recorder;
}

namespace ferry::cupti {

/// Enables the activity kinds and routes their records into `r` (records arriving after r stops
/// capturing still land if they describe work inside the window). Process-wide: one at a time.
/// Loads libcupti at the first call. Throws cuda_error (with the CUPTI result) when CUPTI refuses or
/// cannot be loaded (the message names every library tried), logic_error when already running.
void begin(trace::recorder& r);
/// Flushes every buffered record into the recorder, disables the activity kinds and detaches.
void end();

}  // namespace ferry::cupti
