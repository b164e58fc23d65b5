// The reducer: per-step state machine (begin_step -> mark_ready* -> finish), in-order bucket launch on the
// communication stream, and the plan changes between steps (the first step's rebuild, set_plan).
#include "ferry/comm/reducer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "auto_tuner.hpp"
#include "ferry/core/error.hpp"
#include "ferry/core/units.hpp"

namespace ferry::comm {

// One bucket of the current plan: its countdown for the step, its codec and, with options.timing, its
// events.
struct reducer::bucket_state {
  std::size_t params = 0;     // parameters in the bucket
  std::size_t remaining = 0;  // not yet marked in this step
  event start;
  event reduce_start;
  event reduce_end;
  event end;
  std::unique_ptr<bucket_codec> codec;  // the bucket's exchange (and its state between steps, if any)
};

struct reducer::pending_plan {
  bucket_plan plan;
  std::vector<codec_kind> codecs;
};

namespace {

// The producer streams remembered between launches; more distinct streams than this flush early.
constexpr std::size_t max_producers = 8;

// One scratch buffer lent to every bucket's codec, sized for the largest need: the buckets' work runs one
// after another on the communication stream, so they never use it at once (docs/COMM.md, Note [One
// scratch for every bucket]). Empty when no codec needs one (none of f32, PowerSGD).
buffer make_scratch(device& dev, const std::vector<const bucket_codec*>& codecs) {
  std::size_t bytes = 0;
  for (const bucket_codec* c : codecs) bytes = std::max(bytes, c->scratch_bytes());
  return bytes > 0 ? dev.alloc_device(bytes) : buffer{};
}

std::string list_params(const std::vector<std::size_t>& params, std::size_t total) {
  constexpr std::size_t shown = 10;
  std::string out;
  for (std::size_t k = 0; k < params.size() && k < shown; ++k) {
    if (k > 0) out += ", ";
    out += std::to_string(params[k]);
  }
  if (params.size() > shown) out += fmt::format(" and {} more", params.size() - shown);
  return fmt::format("{} ({} of {})", out, params.size(), total);
}

std::vector<matrix_shape> column_shapes(std::span<const std::size_t> elements) {
  std::vector<matrix_shape> out;
  out.reserve(elements.size());
  for (const std::size_t n : elements) out.push_back({n, 1});
  return out;
}

std::vector<std::size_t> elements_of(std::span<const matrix_shape> shapes) {
  std::vector<std::size_t> out;
  out.reserve(shapes.size());
  for (const matrix_shape& m : shapes) out.push_back(m.elements());
  return out;
}

// 4-byte slots of each parameter's gradient of type t (f32: its elements; 16-bit: half, rounded up).
std::vector<std::size_t> slots_of(std::span<const std::size_t> elements, dtype t) {
  std::vector<std::size_t> out;
  out.reserve(elements.size());
  for (const std::size_t n : elements) out.push_back((n * size_of(t) + sizeof(float) - 1) / sizeof(float));
  return out;
}

// Gradient and reduction types a reducer takes; throws logic_error naming the value otherwise.
void check_types(const reducer_options& o) {
  const dtype g = o.grad_type;
  FERRY_EXPECTS(g == dtype::f32 || g == dtype::bf16 || g == dtype::f16,
                fmt::format("reducer_options::grad_type = {}: expected f32, bf16 or f16", to_string(g)));
  if (o.reduce_type) {
    FERRY_EXPECTS(*o.reduce_type == g || *o.reduce_type == dtype::f32,
                  fmt::format("reducer_options::reduce_type = {} for {} gradients: expected {} or f32",
                              to_string(*o.reduce_type), to_string(g), to_string(g)));
  }
  if (g == dtype::f32) return;
  FERRY_EXPECTS(o.codec == codec_kind::none,
                fmt::format("reducer_options::codec = {} for {} gradients: the lossy codecs compress f32 "
                            "gradients; {} ones are reduced by none (in {} or, with reduce_type f32, in f32)",
                            to_string(o.codec), to_string(g), to_string(g), to_string(g)));
  FERRY_EXPECTS(!o.automatic.enabled || o.automatic.policy == codec_policy::lossless,
                fmt::format("reducer_options::automatic.policy allows lossy codecs for {} gradients: they "
                            "compress f32 gradients only; use the lossless policy",
                            to_string(g)));
}

std::uint64_t model_bytes(std::span<const std::size_t> elements) {
  std::uint64_t total = 0;
  for (const std::size_t n : elements) total += n * sizeof(float);
  return total;
}

// The bytes of one bucket of every gradient: each padded to the alignment, as make_bucket_plan lays it out.
std::size_t one_bucket_bytes(std::span<const std::size_t> elements, std::size_t alignment) {
  std::size_t total = 0;
  for (const std::size_t n : elements) total += (n * sizeof(float) + alignment - 1) / alignment * alignment;
  return std::max(total, alignment);
}

}  // namespace

reducer::reducer(communicator& comm, std::span<const std::size_t> param_elements, reducer_options options)
    : reducer(comm, column_shapes(param_elements), options) {}

reducer::reducer(communicator& comm, std::span<const matrix_shape> param_shapes, reducer_options options)
    : comm_(&comm),
      elements_(elements_of(param_shapes)),
      shapes_(param_shapes.begin(), param_shapes.end()),
      options_(options),
      comm_stream_(comm.dev().make_stream()) {
  check_types(options_);
  sizes_ = slots_of(elements_, options_.grad_type);
  check(options_.plan);
  FERRY_EXPECTS(registered(options_.codec),
                fmt::format("reducer_options::codec = {} is not a codec", static_cast<int>(options_.codec)));
  for (const auto& [c, o] : options_.codec_options) check_codec_options(c, o);
  const bool automatic = options_.automatic.enabled;
  // The automatic plan's own plans until its decision: one bucket of every gradient (the rebuild too).
  if (automatic) {
    options_.plan.first_bucket_bytes = options_.plan.bucket_cap_bytes =
        one_bucket_bytes(sizes_, options_.plan.alignment_bytes);
  }
  bucket_plan first = make_reverse_plan(sizes_, options_.plan);
  if (automatic) detail::check_automatic(options_, model_bytes(sizes_));
  device& dev = comm.dev();
  marked_.assign(sizes_.size(), 0);
  observed_.reserve(sizes_.size());
  producers_.reserve(max_producers);
  ready_ = dev.make_event();
  done_ = dev.make_event();
  if (options_.timing) step_start_ = dev.make_timing_event();
  rebuild_due_ = options_.rebuild;
  if (rebuild_due_) {
    order_dev_ = dev.alloc_device(sizes_.size() * sizeof(std::uint64_t));
    order_host_ = dev.alloc_pinned(sizes_.size() * sizeof(std::uint64_t));
  }
  std::vector<codec_kind> codecs(first.buckets.size(), options_.codec);
  install(first, std::move(codecs));
  if (automatic) start_automatic();
  // The first buffer starts zeroed (the padding between gradients is reduced too, and must stay finite).
  dev.memset_async(flat_.view(), 0, comm_stream_.view());
  comm_stream_.synchronize();
}

reducer::~reducer() {
  // Buffers are freed after this: the communication stream must be done with them. An error of the group
  // (an aborted collective) is rethrown by synchronize; a destructor reports it instead (docs/COMM.md,
  // Note [Errors surface where the caller can act]).
  try {
    comm_stream_.synchronize();
  } catch (const std::exception& e) {
    FERRY_ASSERT_NOTHROW(false, fmt::format("reducer of rank {}: its communication stream failed: {}",
                                            comm_->rank(), e.what()));
  }
}

// At world size 1 there is no link, so nothing to hide behind backward: one bucket, decided at once (its
// all-reduce copies nothing). Else the learner measures the link and the codecs now, over the flat buffer
// (zeroed after), on the communication stream: collective, as every rank constructs its reducer alike.
void reducer::start_automatic() {
  if (comm_->size() == 1) {
    const std::size_t all = options_.plan.bucket_cap_bytes;
    auto_result_ = auto_decision{1, all, all, 0, 0, 0, 0, 0, 0};
    return;
  }
  tuner_ = std::make_unique<detail::auto_tuner>(*comm_, sizes_, options_, flat_.view(), comm_stream_.view());
}

mem_view reducer::grad(std::size_t p) const {
  FERRY_EXPECTS(p < sizes_.size(), fmt::format("grad({}): the reducer has {} parameters (0..{})", p,
                                               sizes_.size(), sizes_.size() - 1));
  return flat_.view(plan_.places[p].offset * sizeof(float), elements_[p] * size_of(options_.grad_type));
}

// Makes `plan` current: buffers, per-bucket state and events. The caller moves the gradients over.
void reducer::install(const bucket_plan& plan, std::vector<codec_kind> codecs) {
  device& dev = comm_->dev();
  buffer flat = dev.alloc_device(plan.total_bytes());
  std::vector<bucket_state> states(plan.buckets.size());
  std::vector<const bucket_codec*> made;
  made.reserve(plan.buckets.size());
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    states[b].params = plan.buckets[b].params.size();
    if (options_.timing) {
      states[b].start = dev.make_timing_event();
      states[b].reduce_start = dev.make_timing_event();
      states[b].reduce_end = dev.make_timing_event();
      states[b].end = dev.make_timing_event();
    }
    states[b].codec = make_codec(plan, b, codecs[b]);
    made.push_back(states[b].codec.get());
  }
  buffer wire_buffer = make_scratch(dev, made);
  std::vector<std::size_t> bucket_of(sizes_.size());
  for (std::size_t p = 0; p < sizes_.size(); ++p) bucket_of[p] = plan.places[p].bucket;
  // Nothing above may fail half-way through the swap below.
  plan_ = plan;
  codecs_ = std::move(codecs);
  flat_ = std::move(flat);
  wire_ = std::move(wire_buffer);
  buckets_ = std::move(states);
  bucket_of_ = std::move(bucket_of);
  stats_.bucket_launches.assign(plan_.buckets.size(), 0);
}

// Bucket b's codec: it sees the bucket's parameters as matrices at their offsets within the bucket.
std::unique_ptr<bucket_codec> reducer::make_codec(const bucket_plan& plan, std::size_t b, codec_kind c) {
  const bucket& k = plan.buckets[b];
  std::vector<matrix_shape> shapes;
  std::vector<std::size_t> offsets;
  shapes.reserve(k.params.size());
  offsets.reserve(k.params.size());
  for (const std::size_t p : k.params) {
    shapes.push_back(shapes_[p]);
    offsets.push_back(plan.places[p].offset - k.offset);
  }
  const dtype reduce = options_.reduce_type.value_or(options_.grad_type);
  const auto given = options_.codec_options.find(c);
  const std::any* o = given != options_.codec_options.end() ? &given->second : nullptr;
  return make_bucket_codec(
      bucket_setup{c, *comm_, k.elements, shapes, offsets, o, options_.grad_type, reduce});
}

void reducer::set_plan(bucket_plan plan, std::vector<codec_kind> codecs) {
  FERRY_EXPECTS(!open_, fmt::format("set_plan during step {}: plans change only between steps; call it after "
                                    "finish()",
                                    step_));
  FERRY_EXPECTS(!tuner_,
                fmt::format("set_plan after step {} while the automatic plan is learning (it decides "
                            "after step {}): it sets the plans itself until its decision took effect; "
                            "wait for learning() to turn false, or construct the reducer without "
                            "automatic.enabled",
                            step_, 1 + 3 * static_cast<std::uint64_t>(options_.automatic.learn_steps)));
  validate(plan, sizes_, options_.plan.alignment_bytes);
  FERRY_EXPECTS(codecs.size() == plan.buckets.size() || codecs.size() == 1,
                fmt::format("set_plan of {} codecs for {} buckets: give one per bucket, or one for all",
                            codecs.size(), plan.buckets.size()));
  for (const codec_kind c : codecs) {
    FERRY_EXPECTS(registered(c), fmt::format("set_plan: codec {} is not a codec (none is registered under "
                                             "that value; see register_codec)",
                                             static_cast<int>(c)));
    FERRY_EXPECTS(c == codec_kind::none || options_.grad_type == dtype::f32,
                  fmt::format("set_plan: codec {} for {} gradients; the lossy codecs compress f32 gradients, "
                              "{} ones take none",
                              to_string(c), to_string(options_.grad_type), to_string(options_.grad_type)));
  }
  queue_plan(std::move(plan), std::move(codecs));
}

// A valid plan with a codec per bucket, to take effect at the next begin_step().
void reducer::queue_plan(bucket_plan plan, std::vector<codec_kind> codecs) {
  if (codecs.size() == 1) codecs.assign(plan.buckets.size(), codecs.front());
  rebuild_due_ = false;
  if (plan == plan_ && codecs == codecs_) {
    pending_.reset();  // what runs now: nothing to change
    return;
  }
  pending_ = std::make_unique<pending_plan>(pending_plan{std::move(plan), std::move(codecs)});
}

// Rank 0's observed order, broadcast through a small device buffer; every rank plans from it.
void reducer::exchange_order() {
  device& dev = comm_->dev();
  const stream_view cs = comm_stream_.view();
  const std::size_t n = sizes_.size();
  // Indices travel as what they are (u64), exact for any number of parameters.
  auto* staged = reinterpret_cast<std::uint64_t*>(order_host_.host_bytes());
  if (comm_->rank() == 0) {
    for (std::size_t k = 0; k < n; ++k) staged[k] = observed_[k];
    dev.copy_async(order_dev_.view(), order_host_.view(), cs);
  }
  static_cast<void>(comm_->broadcast(order_dev_.view(), order_dev_.view(), n, dtype::u64, 0, cs));
  dev.copy_async(order_host_.view(), order_dev_.view(), cs);
  cs.synchronize();
  std::vector<std::size_t> order(n);
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint64_t v = staged[k];
    FERRY_EXPECTS(
        v < n, fmt::format("rank {}: the ready order broadcast by rank 0 holds {} at position {}, not a "
                           "parameter index of this reducer's {}; do the ranks register the same parameters?",
                           comm_->rank(), v, k, n));
    order[k] = static_cast<std::size_t>(v);
  }
  bucket_plan rebuilt = make_bucket_plan(sizes_, order, options_.plan);
  if (rebuilt != plan_) {
    std::vector<codec_kind> codecs(rebuilt.buckets.size(), options_.codec);
    pending_ = std::make_unique<pending_plan>(pending_plan{std::move(rebuilt), std::move(codecs)});
  }
}

// Makes the pending plan current: a new layout moves the gradients into a new buffer; new codecs alone
// change only the changed buckets' codecs and the scratch, and the gradient views stay.
void reducer::apply_pending() {
  device& dev = comm_->dev();
  const stream_view cs = comm_stream_.view();
  if (pending_->plan == plan_) {
    cs.synchronize();  // the last step's buckets may still use the scratch
    // Codec state (PowerSGD's feedback and Q) is kept where a bucket keeps its codec, made afresh where
    // the codec changes (docs/COMM.md, Note [A codec lives as long as its bucket]).
    std::vector<std::unique_ptr<bucket_codec>> states(buckets_.size());
    std::vector<const bucket_codec*> next;
    next.reserve(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (pending_->codecs[b] != codecs_[b]) states[b] = make_codec(plan_, b, pending_->codecs[b]);
      next.push_back(states[b] ? states[b].get() : buckets_[b].codec.get());
    }
    buffer wire_buffer = make_scratch(dev, next);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (states[b]) buckets_[b].codec = std::move(states[b]);
    }
    wire_ = std::move(wire_buffer);
    codecs_ = std::move(pending_->codecs);
    pending_.reset();
    ++stats_.plan_changes;
    return;
  }
  // Whoever still reads or writes the old views (an optimizer, a zeroing kernel) does so on some stream
  // of this device: wait for all of them.
  dev.synchronize();
  const bucket_plan old_plan = plan_;
  buffer old_flat = std::move(flat_);
  std::unique_ptr<pending_plan> next = std::move(pending_);
  try {
    install(next->plan, std::move(next->codecs));
  } catch (...) {
    flat_ = std::move(old_flat);
    throw;
  }
  dev.memset_async(flat_.view(), 0, cs);
  for (std::size_t p = 0; p < sizes_.size(); ++p) {
    const std::size_t bytes = sizes_[p] * sizeof(float);
    dev.copy_async(flat_.view(plan_.places[p].offset * sizeof(float), bytes),
                   old_flat.view(old_plan.places[p].offset * sizeof(float), bytes), cs);
  }
  cs.synchronize();
  ++generation_;
  ++stats_.plan_changes;
}

void reducer::begin_step() {
  FERRY_EXPECTS(!open_, fmt::format("begin_step while step {} is open: call finish() first", step_));
  if (rebuild_due_ && finished_once_) {
    exchange_order();
    rebuild_due_ = false;
  }
  if (pending_) apply_pending();
  // The decided plan took effect just above: the learning is over, and its hooks leave the steps.
  if (tuner_ && tuner_->decision()) tuner_.reset();
  ++step_;
  for (bucket_state& b : buckets_) b.remaining = b.params;
  next_launch_ = 0;
  observed_.clear();
  producers_.clear();
  if (options_.timing) step_start_.record(comm_stream_.view());
  if (tuner_) tuner_->begin_step(step_);
  open_ = true;
}

void reducer::flush_producers() {
  const stream_view cs = comm_stream_.view();
  for (const stream_view& s : producers_) {
    ready_.record(s);
    cs.wait(ready_);
  }
  producers_.clear();
}

void reducer::mark_ready(std::size_t p, stream_view producer) {
  FERRY_EXPECTS(open_, fmt::format("mark_ready({}) outside a step: call begin_step() before backward writes "
                                   "gradients",
                                   p));
  FERRY_EXPECTS(p < sizes_.size(),
                fmt::format("mark_ready({}) in step {}: the reducer has {} parameters (0..{})", p, step_,
                            sizes_.size(), sizes_.size() - 1));
  FERRY_EXPECTS(
      &producer.dev() == &comm_->dev(),
      fmt::format("mark_ready({}) on rank {}: the producer stream belongs to another device than the "
                  "communicator's",
                  p, comm_->rank()));
  const std::size_t b = bucket_of_[p];
  FERRY_EXPECTS(marked_[p] != step_,
                fmt::format("mark_ready({}) twice in step {} (parameter {} of bucket {}): "
                            "each gradient is marked once per step",
                            p, step_, p, b));
  marked_[p] = step_;
  observed_.push_back(p);
  if (tuner_) tuner_->mark_ready(p, producer, observed_.size() == 1);
  if (std::find(producers_.begin(), producers_.end(), producer) == producers_.end()) {
    if (producers_.size() == max_producers) flush_producers();
    producers_.push_back(producer);
  }
  --buckets_[b].remaining;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].remaining == 0) launch(next_launch_++);
}

void reducer::launch(std::size_t b) {
  flush_producers();
  const stream_view cs = comm_stream_.view();
  bucket_state& st = buckets_[b];
  const bucket& k = plan_.buckets[b];
  const mem_view data = flat_.view(k.offset * sizeof(float), k.bytes());
  reduce_marks marks;
  if (options_.timing) {
    st.start.record(cs);
    marks = reduce_marks(&st.reduce_start, &st.reduce_end);
  }
  st.codec->reduce_async(data, wire_.view(), cs, marks);
  if (options_.timing) {
    // A codec that marks no all-reduce is timed as one that ends with its work.
    if (!marks.started()) st.reduce_start.record(cs);
    if (!marks.ended()) st.reduce_end.record(cs);
    st.end.record(cs);
  }
  ++stats_.buckets_launched;
  ++stats_.bucket_launches[b];
  stats_.wire_bytes += st.codec->wire_bytes();
  stats_.gradient_bytes += k.bytes();
}

void reducer::finish(stream_view s) {
  FERRY_EXPECTS(open_, "finish() outside a step: call begin_step() first");
  FERRY_EXPECTS(
      &s.dev() == &comm_->dev(),
      fmt::format("finish() on rank {}: the stream belongs to another device than the communicator's",
                  comm_->rank()));
  if (observed_.size() != sizes_.size()) {
    std::vector<std::size_t> missing;
    for (std::size_t p = 0; p < sizes_.size(); ++p) {
      if (marked_[p] != step_) missing.push_back(p);
    }
    throw logic_error(
        fmt::format("finish() of step {} on rank {}: parameters {} were never marked ready; mark "
                    "every gradient each step (the step stays open)",
                    step_, comm_->rank(), list_params(missing, sizes_.size())));
  }
  const stream_view cs = comm_stream_.view();
  if (tuner_) tuner_->record_end(s);  // before s waits for the buckets: backward's end, not theirs
  done_.record(cs);
  s.wait(done_);
  open_ = false;
  finished_once_ = true;
  ++stats_.steps;
  if (tuner_) {
    std::optional<detail::next_plan> next = tuner_->end_step(plan_, cs);
    if (next) queue_plan(std::move(next->plan), std::move(next->codecs));
    if (tuner_->decision()) auto_result_ = tuner_->decision();
  }
}

const bucket_codec& reducer::codec(std::size_t b) const {
  FERRY_EXPECTS(b < buckets_.size(), fmt::format("codec({}): the plan has {} buckets", b, buckets_.size()));
  return *buckets_[b].codec;
}

std::vector<bucket_timing> reducer::last_step_timing() const {
  FERRY_EXPECTS(options_.timing, "last_step_timing() of a reducer without reducer_options::timing");
  FERRY_EXPECTS(!open_,
                fmt::format("last_step_timing() while step {} is open: call it after finish()", step_));
  FERRY_EXPECTS(finished_once_, "last_step_timing() before any step finished");
  device& dev = comm_->dev();
  std::vector<bucket_timing> out(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const bucket_state& st = buckets_[b];
    st.end.synchronize();
    out[b] =
        bucket_timing{dev.elapsed_ms(step_start_, st.start), dev.elapsed_ms(step_start_, st.reduce_start),
                      dev.elapsed_ms(step_start_, st.reduce_end), dev.elapsed_ms(step_start_, st.end)};
  }
  return out;
}

}  // namespace ferry::comm
