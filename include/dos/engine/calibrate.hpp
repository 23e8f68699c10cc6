#pragma once
/// @file
/// @brief `calibrate(backend, cpu)`: measures a `HardwareProfile` in well under a
///        second, with scratch buffers that are freed before it returns. It lives
///        beside the engine, which runs it at construction, because it drives a
///        backend; the cost model below only consumes its result.
///
/// Each rate is the best of a few short repetitions (the least disturbed one):
///  - CPU Adam on the optimizer's own executor and threads (fp32, 28 B/param), over
///    the backend's pinned memory, where the state lives;
///  - host DRAM: the Adam-shaped probe over the same arrays, on every thread this
///    process may use;
///  - pinned h2d and d2h bandwidth, each alone, then both at once to tell a duplex
///    link from a shared one;
///  - device Adam over a device-resident scratch block, timed with device events.

#include "dos/backend/device_backend.hpp"
#include "dos/comm/any_communicator.hpp"
#include "dos/comm/gather_rows.hpp"
#include "dos/cpu/bandwidth_probe.hpp"
#include "dos/cpu/cpu_adam.hpp"
#include "dos/cpu/executor.hpp"
#include "dos/optim/adam.hpp"
#include "dos/cpu/thread_pool.hpp"
#include "dos/memory/device_buffer.hpp"
#include "dos/schedule/cost_model.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dos {

/// @brief Sizes of the calibration runs.
struct CalibrationSizes {
  /// 8M parameters: 128 MB of state, beyond the caches, so the rate is DRAM's.
  std::size_t cpu_elements = std::size_t{1} << 23;
  std::size_t copy_bytes = std::size_t{32} << 20;      ///< per direction
  std::size_t device_elements = std::size_t{1} << 20;
  int repetitions = 3;
};

namespace detail {
// calibrate_together's row: measured or not, then the six rates of a HardwareProfile.
inline constexpr std::size_t profile_fields = 7;

template <class F>
double best_seconds(int repetitions, F&& f) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repetitions; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return std::max(best, 1e-9);
}
}  // namespace detail

/// @brief Measures the machine behind @p b, with @p cpu as the CPU side.
template <DeviceBackend B, cpu::CpuExecutor E>
HardwareProfile calibrate(B& b, E& cpu, const CalibrationSizes& sizes = {}) {
  HardwareProfile p;
  const std::size_t n = sizes.cpu_elements;

  // CPU Adam, on the executor the optimizer will use, over the memory its state lives
  // in: the backend's pinned memory (docs/design.md, "Calibrating on the state's
  // memory").
  using Pinned = std::remove_cvref_t<decltype(b.pinned_memory())>;
  HostBuffer<float, Pinned> param(n, b.pinned_memory()), grad(n, b.pinned_memory()), m(n, b.pinned_memory()),
      v(n, b.pinned_memory());
  std::fill_n(grad.data(), n, 1e-3f);
  cpu::SegmentWork work;
  work.args = {param.data(), grad.data(), nullptr, m.data(), v.data(), nullptr};
  work.count = n;
  work.kernel = cpu.kernel(DType::f32, DType::f32, false);
  const AdamCoefficients<float> k = coefficients(Adam{}, 1);
  work.coefficients = &k;
  std::vector<cpu::Chunk> chunks;
  cpu::append_chunks(chunks, 0, n);
  cpu.run(chunks, {&work, 1});  // warm the pages
  p.cpu_rate = static_cast<double>(n) / detail::best_seconds(sizes.repetitions, [&] { cpu.run(chunks, {&work, 1}); });

  // Host DRAM, with every thread the process may use.
  {
    ThreadPool all(0);
    p.host_bandwidth = adam_bytes_per_element * static_cast<double>(n) /
                       detail::best_seconds(sizes.repetitions, [&] {
                         adam_shaped_pass(all, param.span(), grad.span(), m.span(), v.span());
                       });
  }

  // The link.
  const std::size_t bytes = sizes.copy_bytes;
  HostBuffer<std::byte, Pinned> host_a(bytes, b.pinned_memory()), host_b(bytes, b.pinned_memory());
  DeviceBuffer<std::remove_cvref_t<decltype(b.device_memory())>> dev_a(bytes, b.device_memory()),
      dev_b(bytes, b.device_memory());
  auto up = b.make_stream();
  auto down = b.make_stream();
  const auto h2d = [&] {
    b.copy_h2d(dev_a.data(), host_a.data(), bytes, up);
    b.synchronize(up);
  };
  const auto d2h = [&] {
    b.copy_d2h(host_b.data(), dev_b.data(), bytes, down);
    b.synchronize(down);
  };
  h2d();
  d2h();
  const double t_up = detail::best_seconds(sizes.repetitions, h2d);
  const double t_down = detail::best_seconds(sizes.repetitions, d2h);
  p.h2d_bandwidth = static_cast<double>(bytes) / t_up;
  p.d2h_bandwidth = static_cast<double>(bytes) / t_down;
  const double t_both = detail::best_seconds(sizes.repetitions, [&] {
    b.copy_h2d(dev_a.data(), host_a.data(), bytes, up);
    b.copy_d2h(host_b.data(), dev_b.data(), bytes, down);
    b.synchronize(up);
    b.synchronize(down);
  });
  // Shared: both at once take about the sum; duplex: about the longer one.
  p.duplex = t_both < 0.75 * (t_up + t_down);

  // Device Adam over scratch that lives on the device, timed by the device's own events:
  // a host clock around launch and synchronize adds their latency to a kernel of some
  // microseconds (the rate came out 2-4x low), and a block that fits in a GPU's L2 cache
  // (tens of MB) measures the cache. A backend names how large its scratch must be
  // (`calibration_device_elements`), within half the memory free now.
  std::size_t d = std::min(sizes.device_elements, bytes / (4 * sizeof(float)));
  std::optional<DeviceBuffer<std::remove_cvref_t<decltype(b.device_memory())>>> large;
  auto* base = reinterpret_cast<float*>(dev_a.data());
  if constexpr (requires { B::calibration_device_elements; }) {
    const std::size_t want = std::min<std::size_t>(B::calibration_device_elements,
                                                   b.staging_bytes_available() / (2 * 4 * sizeof(float)));
    if (want > d) {
      large.emplace(4 * want * sizeof(float), b.device_memory());
      base = reinterpret_cast<float*>(large->data());
      d = want;
    }
  }
  DeviceSegment seg;
  seg.args = {base, base + d, nullptr, base + 2 * d, base + 3 * d, nullptr};
  seg.count = d;
  seg.coefficients = k;
  auto compute = b.make_stream();
  auto start = b.make_event(), stop = b.make_event();
  b.launch_adam({&seg, 1}, compute);  // the first launch also loads the module
  b.synchronize(compute);
  double t_adam = std::numeric_limits<double>::infinity();
  for (int r = 0; r < sizes.repetitions; ++r) {
    b.record(start, compute);
    b.launch_adam({&seg, 1}, compute);
    b.record(stop, compute);
    b.synchronize(stop);
    t_adam = std::min(t_adam, b.elapsed(start, stop));
  }
  p.device_rate = static_cast<double>(d) / std::max(t_adam, 1e-9);
  return p;
}

/// @brief The profile this rank of @p comm plans with. A node's ranks share its cores,
///        its DRAM and often its PCIe switch, and in data-parallel training their
///        updates run at the same time. So all of them calibrate at once (after a
///        barrier): each measures the CPU, DRAM and link rates it gets while the others
///        run too, which is the node's rates divided among its ranks, contention
///        included, rather than one rank's rates alone. Then every rank takes the lowest
///        of each rate (duplex only if all found it): the ranks step in lock-step, so the
///        slowest sets the pace, and all plan alike. A collective: every rank calls it,
///        also one whose device is unusable (its row counts for nothing) or that was
///        given a profile (it keeps that one). `calibrate_node` is the form for users.
/// @param comm the ranks.
/// @param given `InterleaveOptions::profile`: this rank measures nothing when set.
/// @param b this rank's device backend.
/// @param cpu the executor this rank's optimizer updates with.
/// @param sizes the calibration runs' sizes.
/// @return the profile to plan with; nullopt only when this rank's device is unusable.
/// @throws std::invalid_argument on every rank when calibrating threw on any, naming it.
template <DeviceBackend B, cpu::CpuExecutor E>
std::optional<HardwareProfile> calibrate_together(AnyCommunicator& comm, const std::optional<HardwareProfile>& given,
                                                  B& b, E& cpu, const CalibrationSizes& sizes = {}) {
  const bool measure = !given && b.available();
  if (comm.size() == 1) return given ? given : measure ? std::optional(calibrate(b, cpu, sizes)) : std::nullopt;
  comm.barrier();
  constexpr std::size_t fields = detail::profile_fields;
  const std::vector<double> rows =
      gather_rows(comm, fields, "calibration failed", [&](std::span<double> row) {
        if (!measure) return;
        const HardwareProfile p = calibrate(b, cpu, sizes);
        const double values[fields] = {1,           p.cpu_rate,    p.device_rate,   p.h2d_bandwidth,
                                       p.d2h_bandwidth, p.duplex ? 1.0 : 0.0, p.host_bandwidth};
        std::copy(std::begin(values), std::end(values), row.begin());
      });
  if (given) return given;
  if (!b.available()) return std::nullopt;
  HardwareProfile out;
  const auto lowest = [](double& into, double x) { into = into == 0 ? x : std::min(into, x); };
  for (std::size_t r = 0; r < rows.size(); r += fields) {
    if (rows[r] == 0) continue;  // a rank that measured nothing
    lowest(out.cpu_rate, rows[r + 1]);
    lowest(out.device_rate, rows[r + 2]);
    lowest(out.h2d_bandwidth, rows[r + 3]);
    lowest(out.d2h_bandwidth, rows[r + 4]);
    out.duplex = out.duplex && rows[r + 5] != 0;
    lowest(out.host_bandwidth, rows[r + 6]);
  }
  return out;
}

/// @brief `calibrate_together` for users, before building the optimizer: a backend
///        and an executor of their own, freed before it returns. Call it on every rank
///        at the same point (a collective), and pass the result as
///        `Options::interleave.profile` on that rank. A collective of its own rather than
///        one hidden in the optimizer's constructor: a rank whose construction failed
///        before reaching such a collective would leave the others waiting in it.
/// @code
/// dos::Options o;  // with o.communicator set
/// o.interleave.profile = dos::calibrate_node<dos::CudaBackend>(o.communicator, o.cpu());
/// dos::InterleavedOptimizer<dos::CudaBackend> opt(params, dos::AdamW{}, o);
/// @endcode
/// @tparam B the device backend the optimizer will use.
/// @tparam E its CPU executor (the default components' one).
/// @param comm the ranks.
/// @param cpu_config the optimizer's CPU configuration (`Options::cpu()`).
/// @param config the backend's configuration.
/// @return as `calibrate_together` with no profile given.
/// @throws std::invalid_argument on every rank when calibrating threw on any, naming it.
template <DeviceBackend B, cpu::CpuExecutor E = cpu::CpuAdamExecutor>
std::optional<HardwareProfile> calibrate_node(AnyCommunicator& comm, const cpu::CpuConfig& cpu_config,
                                              const typename B::Config& config = {}) {
  std::optional<E> cpu;
  std::optional<B> backend;
  std::exception_ptr failed;
  try {
    cpu.emplace(cpu_config);
    backend.emplace(cpu_config, config);
  } catch (...) {
    failed = std::current_exception();
  }
  if (failed) {  // still take part, so that no rank waits; gather_rows names this rank
    comm.barrier();
    gather_rows(comm, detail::profile_fields, "calibration failed",
                [&](std::span<double>) { std::rethrow_exception(failed); });
    std::rethrow_exception(failed);  // not reached: gather_rows threw on every rank
  }
  return calibrate_together(comm, std::nullopt, *backend, *cpu);
}

}  // namespace dos
