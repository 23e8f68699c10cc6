#pragma once
// A user-written device backend: the emulated device behind a wrapper of its own,
// counting its Adam launches. With `WithGradStats` false it lacks one requirement of
// dos::DeviceBackend while still declaring itself a device backend (the compile-failure
// test).

#include <dos/backend/emulated_device.hpp>

#include <cstddef>
#include <span>

namespace dos::test {

template <bool WithGradStats = true>
class WrappedDevice {
 public:
  using Config = EmulatedDeviceConfig;
  using Stream = EmulatedDeviceBackend::Stream;
  using Event = EmulatedDeviceBackend::Event;
  static constexpr bool is_device_backend = true;

  WrappedDevice(const cpu::CpuConfig& host, const Config& c) : inner_(host, c) {}
  bool available() const { return true; }
  auto& device_memory() { return inner_.device_memory(); }
  auto& pinned_memory() { return inner_.pinned_memory(); }
  Stream make_stream() const { return inner_.make_stream(); }
  Event make_event() const { return inner_.make_event(); }
  void copy_h2d(void* d, const void* s, std::size_t n, Stream& st) { inner_.copy_h2d(d, s, n, st); }
  void copy_d2h(void* d, const void* s, std::size_t n, Stream& st) { inner_.copy_d2h(d, s, n, st); }
  void launch_adam(std::span<const DeviceSegment> segs, Stream& st) {
    ++launches;
    inner_.launch_adam(segs, st);
  }
  void discard(void* d, std::size_t n, Stream& st) { inner_.discard(d, n, st); }
  void record(Event& e, Stream& s) { inner_.record(e, s); }
  void wait(Stream& s, Event& e) { inner_.wait(s, e); }
  void synchronize(Event& e) { inner_.synchronize(e); }
  void synchronize(Stream& s) { inner_.synchronize(s); }
  void wait_for_framework() {}
  double elapsed(const Event& a, const Event& b) const { return inner_.elapsed(a, b); }
  std::size_t staging_bytes_available() const { return inner_.staging_bytes_available(); }
  GradStats grad_stats(const void* d, DType t, std::size_t n)
    requires WithGradStats
  {
    return inner_.grad_stats(d, t, n);
  }
  int launches = 0;

 private:
  EmulatedDeviceBackend inner_;
};

}  // namespace dos::test
