// The codec registry (bucket_codec.hpp): the built-in codecs' table, register_codec and the look-ups,
// and the names (to_string, parse_codec, lossy) that codec.hpp declares.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <utility>

#include "ferry/comm/bucket_codec.hpp"
#include "ferry/comm/powersgd_codec.hpp"
#include "ferry/core/error.hpp"

namespace ferry::comm {

namespace detail {
// The built-in codecs, each in its own file.
codec_entry none_codec_entry();      // elementwise_codecs.cpp
codec_entry fp16_codec_entry();      // elementwise_codecs.cpp
codec_entry bf16_codec_entry();      // elementwise_codecs.cpp
codec_entry powersgd_codec_entry();  // powersgd_codec.cpp
std::unique_ptr<bucket_codec> make_elementwise_codec(const bucket_setup& setup,
                                                     const elementwise_parts& parts);
}  // namespace detail

namespace {

struct builtin {
  codec_kind id;
  codec_entry (*entry)();
};

// Each built-in codec's fixed value (plans broadcast them) and its entry. Registration order is the
// automatic plan's order of candidates (bf16 before fp16).
constexpr std::array<builtin, 4> builtins{{
    {codec_kind::none, detail::none_codec_entry},
    {codec_kind::bf16, detail::bf16_codec_entry},
    {codec_kind::fp16, detail::fp16_codec_entry},
    {powersgd_kind, detail::powersgd_codec_entry},
}};

constexpr std::size_t slots = 256;

class registry {
 public:
  registry() {
    for (const builtin& b : builtins) add(b.id, b.entry());
  }

  codec_kind add(codec_entry entry) {
    const std::lock_guard lock(mutex_);
    std::size_t id = 0;
    while (id < slots && entries_[id]) ++id;
    FERRY_EXPECTS(id < slots,
                  fmt::format("register_codec(\"{}\"): all {} codec values are taken", entry.name, slots));
    return add_locked(static_cast<codec_kind>(id), std::move(entry));
  }

  const codec_entry* find(codec_kind c) const noexcept {
    const std::lock_guard lock(mutex_);
    return entries_[static_cast<std::size_t>(c)].get();
  }

  std::optional<codec_kind> by_name(std::string_view text) const {
    const std::lock_guard lock(mutex_);
    for (std::size_t id = 0; id < slots; ++id) {
      if (entries_[id] && names(*entries_[id], text)) return static_cast<codec_kind>(id);
    }
    return std::nullopt;
  }

  std::vector<codec_kind> all() const {
    const std::lock_guard lock(mutex_);
    std::vector<codec_kind> out;
    for (std::size_t id = 0; id < slots; ++id) {
      if (entries_[id]) out.push_back(static_cast<codec_kind>(id));
    }
    return out;
  }

  std::vector<codec_kind> automatic() const {
    const std::lock_guard lock(mutex_);
    std::vector<codec_kind> out;
    for (const codec_kind c : order_) {
      if (entries_[static_cast<std::size_t>(c)]->automatic) out.push_back(c);
    }
    return out;
  }

 private:
  static bool names(const codec_entry& e, std::string_view text) {
    return e.name == text || std::find(e.aliases.begin(), e.aliases.end(), text) != e.aliases.end();
  }

  void add(codec_kind id, codec_entry entry) {
    const std::lock_guard lock(mutex_);
    add_locked(id, std::move(entry));
  }

  codec_kind add_locked(codec_kind id, codec_entry entry) {
    FERRY_EXPECTS(!entry.name.empty(), "register_codec of a codec without a name");
    std::vector<std::string> wanted{entry.name};
    wanted.insert(wanted.end(), entry.aliases.begin(), entry.aliases.end());
    for (const auto& e : entries_) {
      if (!e) continue;
      for (const std::string& n : wanted) {
        FERRY_EXPECTS(!names(*e, n),
                      fmt::format("register_codec(\"{}\"): the name \"{}\" is codec {}'s already", entry.name,
                                  n, e->name));
      }
    }
    const bool parts = entry.elementwise && entry.elementwise->encode && entry.elementwise->decode;
    FERRY_EXPECTS(entry.make || parts,
                  fmt::format("register_codec(\"{}\"): give a factory (make) or element-wise parts with "
                              "encode and decode",
                              entry.name));
    FERRY_EXPECTS(!entry.automatic || parts,
                  fmt::format("register_codec(\"{}\"): an automatic codec needs element-wise parts with "
                              "encode and decode (the automatic plan measures and models them)",
                              entry.name));
    FERRY_EXPECTS(!entry.check_options || entry.options.has_value(),
                  fmt::format("register_codec(\"{}\"): check_options without options: give the defaults "
                              "(their type is the options' type)",
                              entry.name));
    if (!entry.make) entry.stateless = true;  // made from its element-wise parts
    entries_[static_cast<std::size_t>(id)] = std::make_unique<const codec_entry>(std::move(entry));
    order_.push_back(id);
    return id;
  }

  mutable std::mutex mutex_;
  std::array<std::unique_ptr<const codec_entry>, slots> entries_;
  std::vector<codec_kind> order_;  // registration order
};

registry& codecs() {
  static registry r;
  return r;
}

}  // namespace

codec_kind register_codec(codec_entry entry) { return codecs().add(std::move(entry)); }

bool registered(codec_kind c) noexcept { return codecs().find(c) != nullptr; }

const codec_entry& codec_info(codec_kind c) {
  const codec_entry* e = codecs().find(c);
  FERRY_EXPECTS(e != nullptr,
                fmt::format("codec {} is not registered (register_codec)", static_cast<int>(c)));
  return *e;
}

std::vector<codec_kind> registered_codecs() { return codecs().all(); }

std::vector<codec_kind> automatic_codecs() { return codecs().automatic(); }

bool stateless(codec_kind c) noexcept {
  const codec_entry* e = codecs().find(c);
  return e != nullptr && e->stateless;
}

std::string codec_names(bool (*has)(codec_kind) noexcept) {
  std::vector<std::string_view> names;
  for (const codec_kind c : registered_codecs()) {
    if (has(c)) names.push_back(to_string(c));
  }
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (k > 0) out += k + 1 == names.size() ? " and " : ", ";
    out += names[k];
  }
  return out;
}

void check_codec_options(codec_kind c, const std::any& options) {
  const codec_entry& e = codec_info(c);
  FERRY_EXPECTS(e.options.has_value(), fmt::format("options for codec {}, which takes none", e.name));
  FERRY_EXPECTS(
      options.type() == e.options.type(),
      fmt::format("options for codec {} of another type than its entry's (its defaults' type)", e.name));
  if (e.check_options) e.check_options(options);
}

std::unique_ptr<bucket_codec> make_bucket_codec(const bucket_setup& setup) {
  const codec_entry& e = codec_info(setup.kind);
  FERRY_EXPECTS(setup.kind == codec_kind::none || setup.grad == dtype::f32,
                fmt::format("codec {} for {} gradients: it compresses f32 gradients; {} ones are reduced by "
                            "none",
                            e.name, to_string(setup.grad), to_string(setup.grad)));
  if (setup.options != nullptr) check_codec_options(setup.kind, *setup.options);
  bucket_setup resolved = setup;
  if (resolved.options == nullptr) resolved.options = &e.options;
  if (e.make) return e.make(resolved);
  return detail::make_elementwise_codec(resolved, *e.elementwise);
}

std::string_view to_string(codec_kind c) noexcept {
  const codec_entry* e = codecs().find(c);
  return e != nullptr ? std::string_view(e->name) : std::string_view("unregistered");
}

bool lossy(codec_kind c) noexcept {
  const codec_entry* e = codecs().find(c);
  return e == nullptr || e->lossy;
}

codec_kind parse_codec(std::string_view text) {
  if (const std::optional<codec_kind> c = codecs().by_name(text)) return *c;
  // "none (fp32), fp16, bf16 or powersgd": every name, with the first alias of a lossless codec.
  const std::vector<codec_kind> all = registered_codecs();
  std::string choices;
  for (std::size_t k = 0; k < all.size(); ++k) {
    const codec_entry& e = codec_info(all[k]);
    if (k > 0) choices += k + 1 == all.size() ? " or " : ", ";
    choices += e.name;
    if (!e.lossy && !e.aliases.empty()) choices += fmt::format(" ({})", e.aliases.front());
  }
  throw logic_error(fmt::format("codec \"{}\": expected {}", text, choices));
}

}  // namespace ferry::comm
