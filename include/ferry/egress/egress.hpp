// ferry::egress: the device-to-host pipeline. It drains device outputs into a fixed pool of pinned host
// slots on its own copy stream, overlapping the copies with the producer's next compute, and hands each
// finished slot to a sink on worker threads; a slot returns to the pool only after its sink is done.
//
//   egress::pipeline out(dev, std::make_shared<egress::npy_sink>(dir, shape, "<f4"), {});
//   for (...) {
//     model(batch, logits, compute);                          // fills `logits` on stream `compute`
//     event copied = out.submit(logits.view(), compute, i);    // returns at once unless the pool is full
//     compute.wait(copied);                                    // before `logits` is written again
//   }
//   out.close();                                               // delivers everything, rethrows sink errors
//
// Outputs larger than a slot are split into slot-sized chunks that flow through the same pipeline (each
// chunk reaches the sink as its own delivery, with its offset), so the pinned pool is bounded by
// configuration, not by the largest output.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/core/slot_ring.hpp"
#include "ferry/core/stats.hpp"
#include "ferry/device/device.hpp"

namespace ferry::egress {

/// One delivery to a sink: a whole output, or one chunk of an output larger than a slot.
struct output_chunk {
  std::uint64_t sequence = 0;        // submission number of the output, from 0
  std::uint64_t tag = 0;             // the caller's tag given to submit
  std::uint64_t offset = 0;          // byte offset of this chunk within the output
  std::uint64_t total_bytes = 0;     // size of the whole output
  std::uint32_t chunk = 0;           // chunk index within the output
  std::uint32_t chunks = 1;          // number of chunks of the output
  std::span<const std::byte> bytes;  // pinned host bytes, valid only until consume() returns
  [[nodiscard]] bool last_chunk() const noexcept { return chunk + 1 == chunks; }
};

/// Where delivered bytes go. consume() runs on the pipeline's sink worker threads, concurrently for
/// different deliveries when there are several workers (so the chunks of one output may be consumed at
/// the same time, and with as_completed in any order); an exception it throws fails the pipeline and is
/// rethrown to the caller at its next submit, flush or close.
class sink {
 public:
  virtual ~sink() = default;
  /// Processes one delivery. Must not keep `d.bytes` after returning, nor call the pipeline's flush or
  /// close (they would wait for this delivery).
  virtual void consume(const output_chunk& d) = 0;
  /// Called by pipeline::submit (try_submit, submit_for) on the submitting thread, once per output of
  /// `total_bytes` bytes, before any of its chunks is queued; the default takes every output. Throwing
  /// (a logic_error naming the problem) refuses the output: submit rethrows it, nothing of the output was
  /// queued and the pipeline stays usable. Sinks that keep state per tag (a file per tag, a checksum per
  /// tag) refuse a tag they were already given here, so two outputs never share that state. Called for
  /// outputs that will be queued only (not for a try_submit that finds no free slot), but an output cut
  /// short by close() or a failure after this call keeps its tag taken. May be called by several
  /// pipelines that share the sink at once. A sink that wraps another forwards it.
  virtual void admit(std::uint64_t tag, std::uint64_t total_bytes) {
    static_cast<void>(tag);
    static_cast<void>(total_bytes);
  }
  /// Called by every pipeline::flush() and by close() (unless the pipeline failed), on the caller's
  /// thread, after every output submitted before it was consumed; never by two threads at once.
  virtual void flush() {}
};

/// Options of an egress pipeline. Memory bound: slots * slot_bytes of pinned memory.
///
/// Delivery order: with in_order, slots are handed to the workers in submission order (the chunks of an
/// output in chunk order), so one worker consumes in exactly that order; several workers take them in
/// that order but consume concurrently, so their consume calls may overlap and finish in any order. With
/// as_completed a delivery is handed out as soon as its copy completed.
struct options {
  /// One pinned slot; larger outputs are chunked. A multiple of 8, so that every chunk starts on a
  /// checksum word (the checksum sink's words are 8 bytes of the whole output).
  std::size_t slot_bytes = 64 * (std::size_t{1} << 20);
  std::size_t slots = 8;                              // pinned slots in the pool
  std::size_t sink_workers = 4;                       // threads calling sink::consume
  ferry::delivery order = ferry::delivery::in_order;  // in_order: submission order; or as_completed
};

/// Counters and stage times of a pipeline, for reports and `ferry bench`.
struct pipeline_stats {
  std::uint64_t outputs = 0;           // outputs submitted
  std::uint64_t deliveries = 0;        // chunks consumed by the sink
  std::uint64_t bytes = 0;             // bytes consumed by the sink
  double copy_seconds = 0;             // sum of D2H copy times (timed with events on the egress stream)
  double d2h_gbps = 0;                 // bytes / copy_seconds / 1e9: the achieved copy bandwidth
  double pin_seconds = 0;              // time spent pinning the pool at construction
  std::uint64_t pinned_bytes = 0;      // size of the pool
  std::uint64_t dropped = 0;           // chunks not delivered because the pipeline failed: the one whose
                                       // consume threw, and those not yet consumed at the failure
  std::vector<stage_snapshot> stages;  // "wait_slot" (per output), "copy" and "sink" (per chunk)
};

/// The device-to-host pipeline. Thread-safe: submit may be called from several threads (they take turns:
/// an output's chunks are queued together, in the order of its sequence number). Every pinned slot is
/// allocated at construction; nothing is allocated per output but the pooled event submit returns.
///
/// Threads: one completion thread waits for the copies' events in the order they were queued on the
/// egress stream and marks their slots ready; options::sink_workers threads call sink::consume.
///
/// Failure: the first exception of a sink, of a copy or of the device fails the pipeline. Deliveries
/// taken before it complete; those not yet consumed are dropped (pipeline_stats::dropped) and their slots
/// return to the pool, which becomes full again without close(). Every later submit, flush and close
/// rethrows that first exception; a call blocked in submit or flush wakes and rethrows it.
class pipeline {
 public:
  /// Throws logic_error for zero slots, slot bytes or workers, slot bytes that are not a multiple of 8,
  /// or a null sink; out_of_memory when the pool cannot be pinned (the message names the pool size and
  /// RLIMIT_MEMLOCK where it applies).
  pipeline(device& dev, std::shared_ptr<sink> out, const egress::options& opts = {});
  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;
  /// close()s, reporting (not throwing) an error the caller never collected.
  ~pipeline();

  /// Queues a copy of `data` (device memory) that starts once `producer` reaches this point, and returns
  /// at once unless every slot is in flight (back-pressure: it then blocks until one is free). Returns an
  /// event that completes when the copy out of `data` is done: the producer must wait on it before it
  /// writes `data` again; `data` must stay allocated until then. An output of more chunks than there are
  /// slots streams through: submit queues each chunk as a slot frees up. Throws the first error of a sink
  /// or copy (after which the pipeline is failed), stopped_error after close() (also when close() is
  /// called while it is blocked), logic_error for a non-device or empty view or a producer stream of
  /// another device, and what the sink's admit throws (the file and checksum sinks refuse a tag they
  /// were given before: `tag` names the output to the sink, and defaults to 0); those logic_errors queue
  /// nothing and leave the pipeline usable. When it throws after queuing some chunks of the output (a
  /// streamed output cut short by close or a failure), it first waits until those copies are done, so
  /// `data` is free again.
  [[nodiscard]] event submit(mem_view data, stream_view producer, std::uint64_t tag = 0);
  /// As submit, but returns an empty event, having queued nothing, instead of blocking when the output
  /// would have to wait: all its chunks must find free slots at once, and another thread must not be in
  /// the middle of a submit. Throws logic_error when the output has more chunks than the pool has slots
  /// (it could never succeed), naming both.
  [[nodiscard]] event try_submit(mem_view data, stream_view producer, std::uint64_t tag = 0);
  /// As submit, but gives up (returning an empty event, having queued nothing) after `timeout`. All the
  /// output's chunks must find free slots at once, so, as for try_submit, an output of more chunks than
  /// slots is a logic_error.
  [[nodiscard]] event submit_for(mem_view data, stream_view producer, std::uint64_t tag,
                                 std::chrono::nanoseconds timeout);

  /// Blocks until every output submitted so far has been consumed, then calls sink::flush(). Rethrows
  /// the first error. Other threads may keep submitting meanwhile; flush covers what was submitted
  /// before it was called. Throws stopped_error after close(), logic_error when called from a sink
  /// worker (inside consume), where it would wait for itself.
  void flush();
  /// Delivers what is in flight, stops the threads, calls sink::flush() (unless the pipeline failed) and
  /// rethrows the first error. Idempotent: later calls only rethrow that error. May be called from
  /// another thread while submit is blocked there (which then throws stopped_error); a submit that has
  /// not yet started queuing does not start. Throws logic_error when called from a sink worker.
  void close();

  /// Counters and stage times so far. Thread-safe.
  [[nodiscard]] pipeline_stats stats() const;
  /// The options the pipeline was made with.
  [[nodiscard]] const egress::options& options() const noexcept;
  /// Slots free now. Equals config().slots once everything submitted was consumed (or dropped after a
  /// failure): the pool has returned to full.
  [[nodiscard]] std::size_t free_slots() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// ---- sinks ---------------------------------------------------------------------------------------

/// Discards every delivery (measures the pipeline alone).
class null_sink final : public sink {
 public:
  void consume(const output_chunk&) override {}
};

/// Calls a user function for every delivery (from the worker threads, concurrently).
class callback_sink final : public sink {
 public:
  /// Throws logic_error for an empty function.
  explicit callback_sink(std::function<void(const output_chunk&)> fn);
  void consume(const output_chunk& d) override;

 private:
  std::function<void(const output_chunk&)> fn_;
};

/// A 64-bit checksum of every output, independent of how it was chunked and of delivery order:
/// the wrapping sum over the output's 8-byte little-endian words w_i of mix(w_i + i), with a final partial
/// word zero-padded (mix is splitmix64's finalizer), i being the word's index within the output. The
/// sum is taken per chunk outside any lock and added under a mutex, so workers checksum concurrently.
/// checksum_of computes the same on a host span.
class checksum_sink final : public sink {
 public:
  /// Throws logic_error for a chunk whose offset is not a multiple of 8, or that does not fit the
  /// output its tag already names (a tag reused, or a chunk delivered twice).
  void consume(const output_chunk& d) override;
  /// Refuses (logic_error naming it) a tag already submitted to this sink: there is one checksum per tag.
  void admit(std::uint64_t tag, std::uint64_t total_bytes) override;
  /// Checksum of the output submitted with `tag` (tags must be unique); throws logic_error if unknown
  /// or not yet complete.
  [[nodiscard]] std::uint64_t checksum(std::uint64_t tag) const;
  /// Number of outputs whose every chunk has been consumed.
  [[nodiscard]] std::uint64_t completed() const;

 private:
  struct state;
  std::shared_ptr<state> state_ = make_state();
  static std::shared_ptr<state> make_state();
};

/// The checksum_sink checksum of `bytes` taken as a whole output.
[[nodiscard]] std::uint64_t checksum_of(std::span<const std::byte> bytes) noexcept;

/// Writes each output to `dir/<prefix><tag>.bin` (chunks written at their offsets with pwrite), so
/// chunks of one output may arrive in any order and on any worker. The directory must exist. An output
/// is written under a temporary name `.<prefix><tag>.bin.XXXXXX` and renamed once its last chunk is
/// written and flushed: the final name only ever holds a complete output (a stale file there is
/// replaced then). Throws std::system_error naming the path and the system's reason when the file
/// cannot be created, sized or written; the temporary is then removed and the output's later chunks
/// are dropped.
///
/// Tags: a file sink writes each tag once. A tag already submitted to the sink (by any pipeline, its
/// file complete or not) is refused at submit with a logic_error naming the tag and its file, before
/// anything of that output is copied: two outputs never share one file. pipeline::submit's tag
/// defaults to 0, so give every output its own tag (the step number, say). A chunk of an output other
/// than the one its tag is being written for, passed to consume directly, is a logic_error too. The
/// sink remembers every tag it admitted for its life (a few dozen bytes a tag, one per file written).
class staged_outputs;

class raw_file_sink final : public sink {
 public:
  raw_file_sink(std::filesystem::path dir, std::string prefix = "output_");
  void consume(const output_chunk& d) override;
  /// Refuses a tag already submitted to this sink (see above).
  void admit(std::uint64_t tag, std::uint64_t total_bytes) override;
  [[nodiscard]] std::filesystem::path path_of(std::uint64_t tag) const;

 private:
  std::filesystem::path dir_;
  std::string prefix_;
  std::shared_ptr<staged_outputs> staged_;  // outputs under their temporary names
};

/// Writes each output to `dir/<prefix><tag>.npy`, a NumPy .npy (format 1.0) file with the given shape and
/// dtype descriptor (e.g. "<f4"), which numpy.load reads; like raw_file_sink, under a temporary name
/// until complete, and each tag once (as raw_file_sink). An output whose size does not match the shape
/// is refused at submit (and is a logic_error at consume); std::system_error (path and reason) as
/// raw_file_sink. The header is padded with spaces and a newline so that the data starts at a multiple
/// of 64 bytes.
class npy_sink final : public sink {
 public:
  /// Accepted dtypes: byte order '<', '>' or '|', then b1, i1/i2/i4/i8, u1/u2/u4/u8, f2/f4/f8 or c8/c16.
  /// Throws logic_error naming the dtype otherwise.
  npy_sink(std::filesystem::path dir, std::vector<std::size_t> shape, std::string dtype = "<f4",
           std::string prefix = "output_");
  void consume(const output_chunk& d) override;
  /// Refuses a tag already submitted to this sink, and an output whose size does not match the shape.
  void admit(std::uint64_t tag, std::uint64_t total_bytes) override;
  [[nodiscard]] std::filesystem::path path_of(std::uint64_t tag) const;
  /// The .npy header every file starts with: magic, version, length and the padded dictionary.
  [[nodiscard]] const std::string& header() const noexcept { return header_; }

 private:
  void expect_size(std::uint64_t tag, std::uint64_t total_bytes) const;

  std::filesystem::path dir_;
  std::vector<std::size_t> shape_;
  std::string dtype_;
  std::string prefix_;
  std::string header_;
  std::size_t item_bytes_ = 0;
  std::uint64_t data_bytes_ = 0;            // what every output must hold: the product of shape * item_bytes_
  std::shared_ptr<staged_outputs> staged_;  // outputs under their temporary names
};

}  // namespace ferry::egress
