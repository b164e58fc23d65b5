// The layout of a batch slot, shared by the loader (pinned slots) and the prefetcher (device slots):
// fields one after the other, each holding batch_size samples contiguously, each field's base aligned to
// 256 bytes, and the slot size a multiple of 256 so every slot of a pool starts aligned too.
#pragma once

#include <cstddef>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "ferry/core/error.hpp"
#include "ferry/ingest/ingest.hpp"

namespace ferry::ingest::detail {

inline constexpr std::size_t field_alignment = 256;

struct batch_layout {
  std::vector<std::size_t> offset;        // per field, within a slot
  std::vector<std::size_t> sample_bytes;  // per field
  std::vector<std::size_t> field_bytes;   // per field: batch_size * sample_bytes
  std::size_t slot_bytes = 0;             // aligned
  std::size_t batch_bytes = 0;            // unaligned sum of field_bytes

  batch_layout(const std::vector<field>& fields, std::size_t batch_size) {
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    for (const field& f : fields) {
      FERRY_EXPECTS(f.sample_bytes <= (max - field_alignment) / batch_size,
                    fmt::format("ingest field '{}' of {} bytes per sample times batch_size {} overflows the "
                                "address space",
                                f.name, f.sample_bytes, batch_size));
      const std::size_t bytes = f.sample_bytes * batch_size;
      FERRY_EXPECTS(slot_bytes <= max - field_alignment - bytes,
                    fmt::format("ingest batch of batch_size {} overflows the address space", batch_size));
      offset.push_back(slot_bytes);
      sample_bytes.push_back(f.sample_bytes);
      field_bytes.push_back(bytes);
      batch_bytes += bytes;
      slot_bytes += (bytes + field_alignment - 1) / field_alignment * field_alignment;
    }
  }
};

}  // namespace ferry::ingest::detail
