#pragma once
/// @file
/// @brief Optimizer checkpoints (needs nlohmann-json; link `dos::checkpoint`):
///        `dos::save`, `dos::load`, and `dos::AsyncCheckpointer`.
///
/// A checkpoint is a directory: one safetensors file per rank holding the state
/// tensors under torch's optimizer `state_dict` names (`state.<param>.exp_avg`,
/// `exp_avg_sq`, `max_exp_avg_sq`, and `master` for 16-bit parameters), and
/// `index.json` naming the files, the dos version, hyperparameters per group, the step
/// count, the schedule index, the loss scaler, the subgroup size and an XXH64 checksum
/// per tensor. Saves are crash-consistent; loads check everything before changing the
/// optimizer; state is stored per parameter, so a checkpoint loads into any subgroup
/// size. `tools/dos_checkpoint.py` converts to and from torch's `state_dict`.

#include "dos/checkpoint/async.hpp"
#include "dos/checkpoint/hash.hpp"
#include "dos/checkpoint/index.hpp"
#include "dos/checkpoint/reader.hpp"
#include "dos/checkpoint/safetensors.hpp"
#include "dos/checkpoint/target.hpp"
#include "dos/checkpoint/writer.hpp"

#include <filesystem>
#include <optional>

namespace dos {

/// @brief Saves @p opt's state to checkpoint directory @p dir, crash-consistently:
///        if the process dies during the save, the checkpoint previously in @p dir
///        still loads. Blocks until the files are durable.
/// @throws std::runtime_error naming the path for an I/O failure;
///         std::invalid_argument if the optimizer cannot read its state.
template <CheckpointTarget O>
void save(O& opt, const std::filesystem::path& dir) {
  checkpoint::Snapshot s;
  s.capture(opt);
  checkpoint::write_snapshot(s, dir);
}

/// @brief Restores @p opt from checkpoint directory @p dir (see `checkpoint::load_into`
///        for what is restored). Every file, tensor and checksum is checked first.
/// @throws std::runtime_error naming the file and the tensor for a missing,
///         truncated or corrupted file, a lying header or a newer format;
///         std::invalid_argument for a checkpoint of a different model. @p opt is
///         unchanged then.
template <CheckpointTarget O>
void load(O& opt, const std::filesystem::path& dir) {
  const checkpoint::CheckpointReader r(dir);
  checkpoint::load_into(opt, r);
}

/// @brief What the cost model of the optimizer saved in @p dir had learned of the
///        machine (its rates, refined by every step), for a resumed run on the same
///        machine to start from instead of calibrating:
/// @code
/// dos::Options o;
/// o.interleave.profile = dos::saved_hardware_profile("ckpt");  // nullopt: calibrate
/// @endcode
/// @return nullopt for a checkpoint of a host-only optimizer.
/// @throws std::runtime_error naming the path for a missing or invalid checkpoint.
inline std::optional<HardwareProfile> saved_hardware_profile(const std::filesystem::path& dir) {
  return checkpoint::CheckpointReader(dir).index().hardware_profile;
}

}  // namespace dos
