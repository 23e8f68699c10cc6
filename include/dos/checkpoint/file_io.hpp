#pragma once
/// @file
/// @brief The POSIX file operations a crash-consistent checkpoint needs: whole
///        writes, fsync of files and directories, atomic rename, read-only mappings.
///        Every failure throws `std::runtime_error` naming the path and errno's text.

#include <fmt/format.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dos::checkpoint {

/// @brief Throws `std::runtime_error` with the "dos: " prefix.
template <class... Args>
[[noreturn]] void throw_runtime_error(fmt::format_string<Args...> format, Args&&... args) {
  throw std::runtime_error("dos: " + fmt::format(format, std::forward<Args>(args)...));
}

namespace detail {

[[noreturn]] inline void throw_errno(std::string_view what, const std::filesystem::path& path) {
  const int e = errno;
  throw_runtime_error("{} {}: {}", what, path.string(), std::strerror(e));
}

/// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  Fd(const std::filesystem::path& path, int flags, mode_t mode = 0644) : path_(path) {
    do fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) throw_errno("cannot open", path);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  const std::filesystem::path& path() const noexcept { return path_; }

  void write_all(const void* data, std::size_t size) const {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      // Linux writes at most ~2 GiB per call; loop for the rest and for EINTR.
      const ssize_t n = ::write(fd_, p, std::min<std::size_t>(size, std::size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno("cannot write", path_);
      }
      p += n;
      size -= static_cast<std::size_t>(n);
    }
  }
  void sync() const {
    if (::fsync(fd_) != 0) throw_errno("cannot fsync", path_);
  }
  /// Closes and reports the error close() may return (deferred write-back failures).
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) throw_errno("cannot close", path_);
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  std::filesystem::path path_;
};

/// Makes a completed rename or file creation in @p dir durable.
inline void sync_directory(const std::filesystem::path& dir) {
  Fd d(dir, O_RDONLY | O_DIRECTORY);
  d.sync();
}

/// Writes @p parts to @p tmp, fsyncs it, and renames it to @p final (atomic on POSIX:
/// a reader sees the old file or the complete new one, never a partial one). The
/// caller syncs the directory once all renames are done.
template <class Parts>
void write_durably(const std::filesystem::path& tmp, const std::filesystem::path& final, const Parts& parts) {
  {
    Fd f(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    for (const auto& [data, size] : parts) f.write_all(data, size);
    f.sync();
    f.close();
  }
  if (::rename(tmp.c_str(), final.c_str()) != 0) throw_errno("cannot rename into place", final);
}

/// A read-only private mapping of a whole file (empty files map to nothing).
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path) : path_(path) {
    Fd f(path, O_RDONLY);
    struct stat st {};
    if (::fstat(f.get(), &st) != 0) throw_errno("cannot stat", path);
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.get(), 0);
    if (p == MAP_FAILED) throw_errno("cannot map", path);
    data_ = static_cast<const std::byte*>(p);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail
}  // namespace dos::checkpoint
