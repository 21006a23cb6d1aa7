#include "weights_flag.hpp"

#include <fmt/format.h>

#include "cli.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"
#include "options.hpp"

namespace eredu::cli {

void add_weights_flag(CLI::App& command, std::string& value) {
  add_choice(command, "--weights", value, app::choice_names<std::vector<std::string>>(app::weight_choices),
             "where dtype-kept tensors live: copy (into process memory), map (the checkpoint's page-cache pages, "
             "mapped read-only: no copy, but a file rewritten in place changes them; see docs/cli.md) or map-lock "
             "(mapped and pinned with mlock, within RLIMIT_MEMLOCK)");
}

cpu::WeightStorage weight_storage(const std::string& value) {
  return app::parse_choice(app::weight_choices, value).value_or(cpu::WeightStorage::copied);
}

MappedCount count_mapped(const app::TensorSetModule& model) {
  MappedCount n;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const cpu::Tensor& t = model.slot(i).value;
    const io::MappedTensor* mapped = t ? t.storage()->mapping() : nullptr;
    if (!mapped) continue;
    ++n.tensors;
    n.bytes += t.nbytes();
    if (mapped->locked()) n.locked_bytes += t.nbytes();
  }
  return n;
}

std::string weights_summary(const std::string& value, const MappedCount& count, std::size_t tensors) {
  if (value == "copy") return {};
  std::string locked;
  if (value == "map-lock") {
    const io::MemoryLockLimit limit = io::memory_lock_limit();
    locked = fmt::format("; {} locked (RLIMIT_MEMLOCK {}{})", format_bytes(count.locked_bytes),
                         limit.limit == UINT64_MAX ? "unlimited" : format_bytes(limit.limit),
                         limit.exempt ? ", not applied: CAP_IPC_LOCK" : "");
  }
  return fmt::format("{} of {} tensors ({}) mapped read-only from the page cache, the rest copied{}", count.tensors,
                     tensors, format_bytes(count.bytes), locked);
}

}  // namespace eredu::cli
