#include "kernels/tcp/env_group.hpp"

#include <algorithm>  // std::min, std::count
#include <cerrno>     // errno
#include <cstdint>    // std::uint32_t, std::uint64_t
#include <cstdio>     // std::fflush
#include <cstdlib>    // std::getenv
#include <cstring>    // std::memcpy, std::strerror
#include <iostream>   // std::cerr
#include <map>        // std::map: hosts, counted
#include <thread>     // std::this_thread::sleep_for
#include <vector>     // std::vector

#include <fcntl.h>        // fcntl
#include <netdb.h>        // getaddrinfo
#include <netinet/in.h>   // sockaddr_in6
#include <netinet/tcp.h>  // TCP_NODELAY
#include <poll.h>         // poll
#include <sys/socket.h>   // socket, bind, listen, accept, connect, send, recv
#include <unistd.h>       // close, getpid, gethostname, _exit

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"  // UsageError, HangError, Error
#include "harness/text.hpp"    // parse_whole, split, rank_ranges

namespace sb {

namespace {

using clock_type = std::chrono::steady_clock;
using Deadline = ProcessGroup::Deadline;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// An integer variable of the launch, whole and in [lo, hi]; nullopt when unset.
std::optional<int> env_int(const char* name, int lo, int hi) {
  const char* v = env(name);
  if (!v) return std::nullopt;
  const auto n = text::parse_whole<long long>(v);
  if (!n || *n < lo || *n > hi)
    throw UsageError(fmt::format("env:// launch: {}='{}' is not an integer in [{}, {}]", name, v, lo, hi));
  return static_cast<int>(*n);
}

// ---- frames: a header (magic, type, length) and the bytes ----

constexpr std::uint32_t kMagic = 0x53425047;  // "SBPG"
constexpr std::uint64_t kMaxFrame = 64ull << 20;  // the control plane carries ids and figures, never data
enum class Frame : std::uint32_t { hello = 1, roster = 2, error = 3, data = 4, abort = 5 };

struct Header {
  std::uint32_t magic, type;
  std::uint64_t len;
};

int ms_left(Deadline d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - clock_type::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<long long>(ms, 1000));
}

// Waits until fd is readable (or writable); false at the deadline.
bool wait_fd(int fd, short events, Deadline d) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(d));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) throw Error(ErrorKind::runtime, fmt::format("poll failed: {}", std::strerror(errno)));
    if (clock_type::now() >= d) return false;
  }
}

struct Closed {};  // the peer closed its end

void read_all(int fd, void* buf, std::size_t n, Deadline d, const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, d)) throw HangError(fmt::format("{}: no answer before the deadline", what));
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) throw Closed{};
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == ECONNRESET) throw Closed{};
      throw Error(ErrorKind::runtime, fmt::format("{}: recv failed: {}", what, std::strerror(errno)));
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

void write_all(int fd, const void* buf, std::size_t n, Deadline d, const std::string& what) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, d)) throw HangError(fmt::format("{}: could not send before the deadline", what));
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == EPIPE || errno == ECONNRESET) throw Closed{};
      throw Error(ErrorKind::runtime, fmt::format("{}: send failed: {}", what, std::strerror(errno)));
    }
    p += put;
    n -= static_cast<std::size_t>(put);
  }
}

void send_frame(int fd, Frame type, const std::string& bytes, Deadline d, const std::string& what) {
  const Header h{kMagic, static_cast<std::uint32_t>(type), bytes.size()};
  write_all(fd, &h, sizeof h, d, what);
  write_all(fd, bytes.data(), bytes.size(), d, what);
}

// A frame from a peer; a stray connection (another program on the port) fails the magic check.
std::pair<Frame, std::string> recv_frame(int fd, Deadline d, const std::string& what) {
  Header h{};
  read_all(fd, &h, sizeof h, d, what);
  if (h.magic != kMagic || h.type < 1 || h.type > 5 || h.len > kMaxFrame)
    throw UsageError(fmt::format("{}: the peer does not speak stallbench's rendezvous (another program on the port?)",
                                 what));
  std::string bytes(static_cast<std::size_t>(h.len), '\0');
  read_all(fd, bytes.data(), bytes.size(), d, what);
  return {static_cast<Frame>(h.type), std::move(bytes)};
}

// An error frame is "<kind>\n<message>": the same error on every rank.
[[noreturn]] void throw_peer_error(const std::string& payload, int from) {
  const auto nl = payload.find('\n');
  const std::string kind = payload.substr(0, nl);
  const std::string msg = nl == std::string::npos ? payload : payload.substr(nl + 1);
  const std::string text = fmt::format("{} (said by rank {})", msg, from);
  if (kind == "usage") throw UsageError(text);
  if (kind == "hang") throw HangError(text);
  throw Error(ErrorKind::runtime, text);
}

[[noreturn]] void exit_on_abort(const std::string& payload, int from) {
  const auto code = text::parse_whole<int>(payload);
  std::cerr << fmt::format("stallbench: rank {} aborted the job (exit {})\n", from, code.value_or(1));
  std::fflush(nullptr);
  _exit(code.value_or(1));
}

std::string hostname() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

using Member = RdzvMember;

class EnvProcessGroup final : public ProcessGroup {
 public:
  explicit EnvProcessGroup(const EnvLaunch& l) : l_(l), fds_(std::size_t(l.world_size), -1) {
    me_.rank = l.rank;
    me_.world = l.world_size;
    me_.local_rank = l.local_rank;
    me_.pid = static_cast<long long>(::getpid());
    me_.job = l.job;
    me_.host = hostname();
    set_error_rank(l.world_size > 1 ? l.rank : -1);
    const Deadline d = clock_type::now() + l.timeout;
    if (l.world_size > 1) {
      if (l.rank == 0) accept_all(d);
      else join(d);
    }
    // every rank's host: from the roster (rank 0's own list when it made it), this one's where none came
    std::vector<std::string> hosts(std::size_t(l.world_size), me_.host);
    for (const Member& m : members_) hosts[std::size_t(m.rank)] = m.host;
    // LOCAL_RANK and LOCAL_WORLD_SIZE when the launcher gave them; else counted by host name
    local_size_ = l.local_world_size > 0 ? l.local_world_size
                                         : static_cast<int>(std::count(hosts.begin(), hosts.end(), me_.host));
    local_rank_ = l.local_rank >= 0 ? l.local_rank
                                    : static_cast<int>(std::count(hosts.begin(), hosts.begin() + l.rank, me_.host));
  }
  ~EnvProcessGroup() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }

  int rank() const override { return l_.rank; }
  int size() const override { return l_.world_size; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string launcher() const override { return l_.launcher; }
  std::string host() const override { return me_.host; }
  std::string library() const override {
    return fmt::format("TCP rendezvous at {}:{}, port: {}", l_.master_addr, l_.port, l_.port_why);
  }

  void barrier(Deadline d) override {
    (void)gather0("", d, "barrier");
    (void)bcast0("", d, "barrier");
  }
  std::vector<double> allgather(double v, Deadline d) override { return allgather_pod(v, d); }
  std::vector<std::int64_t> allgather(std::int64_t v, Deadline d) override { return allgather_pod(v, d); }
  std::string broadcast(const std::string& bytes, int root, Deadline d) override {
    check_root(root);
    const auto all = gather0(rank() == root ? bytes : std::string(), d, "broadcast");
    return bcast0(rank() == 0 ? all[std::size_t(root)] : std::string(), d, "broadcast");
  }
  std::vector<std::string> gather(const std::string& bytes, int root, Deadline d) override {
    check_root(root);
    auto all = gather0(bytes, d, "gather");
    if (root == 0) return all;
    if (rank() == 0) {  // rank 0 holds them: it forwards them to root, as lengths and bytes
      const std::string packed = pack_parts(all);
      guarded(root, "gather", [&] { send_frame(fds_[std::size_t(root)], Frame::data, packed, d, what("gather", root)); });
      return {};
    }
    if (rank() != root) return {};
    return unpack_parts(recv_data(0, d, "gather"), std::size_t(size()));
  }

  [[noreturn]] void abort(int code) noexcept override {
    // Best effort, without blocking: every peer this rank holds a connection to ends too.
    const std::string payload = std::to_string(code);
    const Header h{kMagic, static_cast<std::uint32_t>(Frame::abort), payload.size()};
    for (int fd : fds_)
      if (fd >= 0) {
        (void)::send(fd, &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    std::fflush(nullptr);
    _exit(code);
  }

 private:
  std::string what(const char* op, int peer) const {
    return fmt::format("{} (rank {} of {}, with rank {})", op, rank(), size(), peer);
  }
  void check_root(int root) const {
    if (root < 0 || root >= size()) throw Error(ErrorKind::runtime, fmt::format("root {} is not a rank of {}", root, size()));
  }

  // Runs f on the connection to peer; a closed connection is that peer gone.
  template <class F>
  void guarded(int peer, const char* op, F&& f) {
    try {
      f();
    } catch (const Closed&) {
      throw Error(ErrorKind::runtime, fmt::format("{}: rank {} closed its connection (it exited, or was killed)",
                                                  what(op, peer), peer));
    }
  }

  std::string recv_data(int peer, Deadline d, const char* op) {
    std::pair<Frame, std::string> f;
    guarded(peer, op, [&] { f = recv_frame(fds_[std::size_t(peer)], d, what(op, peer)); });
    if (f.first == Frame::abort) exit_on_abort(f.second, peer);
    if (f.first == Frame::error) throw_peer_error(f.second, peer);
    if (f.first != Frame::data) throw Error(ErrorKind::runtime, fmt::format("{}: unexpected frame", what(op, peer)));
    return std::move(f.second);
  }

  // Every rank's bytes on rank 0 (others get an empty vector). Rank 0 waits on all peers at
  // once: past the deadline it names those that never sent.
  std::vector<std::string> gather0(const std::string& mine, Deadline d, const char* op) {
    if (size() == 1) return {mine};
    if (rank() != 0) {
      guarded(0, op, [&] { send_frame(fds_[0], Frame::data, mine, d, what(op, 0)); });
      return {};
    }
    std::vector<std::string> all(static_cast<std::size_t>(size()));
    all[0] = mine;
    std::vector<int> pending;
    for (int r = 1; r < size(); ++r) pending.push_back(r);
    const auto t0 = clock_type::now();
    while (!pending.empty()) {
      std::vector<pollfd> ps;
      for (int r : pending) ps.push_back({fds_[std::size_t(r)], POLLIN, 0});
      const int n = ::poll(ps.data(), ps.size(), ms_left(d));
      if (n < 0 && errno != EINTR) throw Error(ErrorKind::runtime, fmt::format("poll failed: {}", std::strerror(errno)));
      std::vector<int> still;
      for (std::size_t i = 0; i < ps.size(); ++i) {
        if (ps[i].revents == 0) {
          still.push_back(pending[i]);
          continue;
        }
        all[std::size_t(pending[i])] = recv_data(pending[i], d, op);
      }
      pending = std::move(still);
      if (!pending.empty() && clock_type::now() >= d)
        throw HangError(fmt::format("{} of {} ranks: rank 0 waited {:.0f} s for rank{} {}, which never arrived",
                                    op, size(), std::chrono::duration<double>(clock_type::now() - t0).count(),
                                    pending.size() == 1 ? "" : "s", text::rank_ranges(pending, 16)));
    }
    return all;
  }

  // Rank 0's bytes on every rank.
  std::string bcast0(const std::string& bytes, Deadline d, const char* op) {
    if (size() == 1) return bytes;
    if (rank() != 0) return recv_data(0, d, op);
    for (int r = 1; r < size(); ++r)
      guarded(r, op, [&] { send_frame(fds_[std::size_t(r)], Frame::data, bytes, d, what(op, r)); });
    return bytes;
  }

  template <class T>
  std::vector<T> allgather_pod(T v, Deadline d) {
    std::string mine(sizeof v, '\0');
    std::memcpy(mine.data(), &v, sizeof v);
    const auto all = gather0(mine, d, "allgather");
    std::string packed;
    if (rank() == 0)
      for (const auto& b : all) packed += b;
    packed = bcast0(packed, d, "allgather");
    if (packed.size() != sizeof v * std::size_t(size()))
      throw Error(ErrorKind::runtime, "allgather: rank 0 sent a frame of the wrong size");
    std::vector<T> out(static_cast<std::size_t>(size()));
    std::memcpy(out.data(), packed.data(), packed.size());
    return out;
  }

  // ---- rendezvous ----

  void listen_on_port() {
    // one socket for IPv6 and IPv4 where the host allows it, else IPv4
    int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int zero = 0, one = 1;
    if (fd >= 0) {
      (void)::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<std::uint16_t>(l_.port));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        const int e = errno;
        ::close(fd);
        fd = -1;
        if (e == EADDRINUSE) bind_failed(e);
      }
    }
    if (fd < 0) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) throw Error(ErrorKind::runtime, fmt::format("socket failed: {}", std::strerror(errno)));
      (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<std::uint16_t>(l_.port));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        const int e = errno;
        ::close(fd);
        bind_failed(e);
      }
    }
    if (::listen(fd, 128) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error(ErrorKind::runtime, fmt::format("listen on port {} failed: {}", l_.port, std::strerror(e)));
    }
    listen_fd_ = fd;
  }

  [[noreturn]] void bind_failed(int e) const {
    throw UsageError(fmt::format("env:// rendezvous: rank 0 cannot listen on port {} ({}): {}; set "
                                 "STALLBENCH_RDZV_PORT to a free port, the same on every rank",
                                 l_.port, l_.port_why, std::strerror(e)));
  }

  void accept_all(Deadline d) {
    listen_on_port();
    int joined = 1;
    const auto t0 = clock_type::now();
    while (joined < size()) {
      if (!wait_fd(listen_fd_, POLLIN, d)) {
        std::vector<int> absent;
        for (int r = 1; r < size(); ++r)
          if (fds_[std::size_t(r)] < 0) absent.push_back(r);
        const std::string msg =
            fmt::format("env:// rendezvous at {}:{}: rank{} {} of {} did not join within {:.0f} s "
                        "(STALLBENCH_RDZV_TIMEOUT; not started, crashed, or cannot reach {})",
                        l_.master_addr, l_.port, absent.size() == 1 ? "" : "s", text::rank_ranges(absent, 16), size(),
                        std::chrono::duration<double>(clock_type::now() - t0).count(), l_.master_addr);
        tell_all(Frame::error, "hang\n" + msg);
        throw HangError(msg);
      }
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int one = 1;
      (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      // a peer has a few seconds to say who it is; a silent or foreign connection is dropped
      std::optional<Member> m;
      try {
        const auto [type, bytes] = recv_frame(fd, std::min(d, clock_type::now() + std::chrono::seconds(10)), "hello");
        if (type == Frame::hello) m = parse_rdzv_hello(bytes);
      } catch (const Error& e) {
        std::cerr << fmt::format("stallbench: rank 0: dropped a connection on port {}: {}\n", l_.port, e.what());
      } catch (const Closed&) {
      }
      if (!m) {
        ::close(fd);
        continue;
      }
      std::string refuse;
      if (m->job != me_.job)
        refuse = fmt::format("rank {} belongs to another job ({}) than rank 0 ({})", m->rank,
                             m->job.empty() ? "none" : m->job, me_.job.empty() ? "none" : me_.job);
      else if (m->world != size())
        refuse = fmt::format("WORLD_SIZE differs: rank {} says {}, rank 0 says {}", m->rank, m->world, size());
      else if (m->rank <= 0 || m->rank >= size())
        refuse = fmt::format("rank {} is not in [1, {}): RANK is wrong on one of the processes", m->rank, size());
      else if (fds_[std::size_t(m->rank)] >= 0)
        refuse = fmt::format("two processes claim rank {} (pids {} on {} and {} on {})", m->rank,
                             members_[std::size_t(m->rank)].pid, members_[std::size_t(m->rank)].host, m->pid, m->host);
      if (!refuse.empty()) {
        const std::string msg = "env:// rendezvous: " + refuse;
        try {
          send_frame(fd, Frame::error, "usage\n" + msg, clock_type::now() + std::chrono::seconds(2), "refusal");
        } catch (...) {
        }
        ::close(fd);
        if (m->job != me_.job) {  // a stray rank of another job: it is told, and this job goes on waiting
          std::cerr << "stallbench: rank 0: " << msg << "; refused it\n";
          continue;
        }
        tell_all(Frame::error, "usage\n" + msg);
        throw UsageError(msg);
      }
      if (members_.empty()) members_.resize(std::size_t(size()));
      members_[std::size_t(m->rank)] = *m;
      fds_[std::size_t(m->rank)] = fd;
      ++joined;
    }
    ::close(listen_fd_);
    listen_fd_ = -1;
    members_[0] = me_;
    const std::string text = rdzv_roster_text(members_);
    for (int r = 1; r < size(); ++r)
      guarded(r, "rendezvous", [&] { send_frame(fds_[std::size_t(r)], Frame::roster, text, d, what("rendezvous", r)); });
  }

  // Best effort: every connected peer gets the same error, so each rank says the same thing.
  void tell_all(Frame type, const std::string& payload) {
    for (int r = 1; r < size(); ++r)
      if (fds_[std::size_t(r)] >= 0) try {
          send_frame(fds_[std::size_t(r)], type, payload, clock_type::now() + std::chrono::seconds(2), "error");
        } catch (...) {
        }
  }

  void join(Deadline d) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(l_.port);
    const auto t0 = clock_type::now();
    int fd = -1;
    std::string last_error = "no answer";
    while (fd < 0) {
      if (clock_type::now() >= d)
        throw HangError(fmt::format("env:// rendezvous: rank {} could not reach rank 0 at {}:{} within {:.0f} s "
                                    "(STALLBENCH_RDZV_TIMEOUT): {} (rank 0 not started, crashed, or another address)",
                                    rank(), l_.master_addr, l_.port,
                                    std::chrono::duration<double>(clock_type::now() - t0).count(), last_error));
      const int rc = ::getaddrinfo(l_.master_addr.c_str(), port.c_str(), &hints, &res);
      if (rc != 0) {
        last_error = fmt::format("MASTER_ADDR '{}' does not resolve: {}", l_.master_addr, gai_strerror(rc));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      for (addrinfo* a = res; a && fd < 0; a = a->ai_next) fd = try_connect(a, d, last_error);
      ::freeaddrinfo(res);
      if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    fds_[0] = fd;
    std::pair<Frame, std::string> f;
    try {
      send_frame(fd, Frame::hello, rdzv_hello_text(me_), d, what("rendezvous", 0));
      // rank 0 started its clock later, maybe: its verdict (a rank that never came) is waited for
      f = recv_frame(fd, d + std::chrono::seconds(10), what("rendezvous", 0));
    } catch (const Closed&) {
      throw Error(ErrorKind::runtime, fmt::format("env:// rendezvous: rank 0 at {}:{} closed the connection before "
                                                  "every rank had joined (it failed: see its message)",
                                                  l_.master_addr, l_.port));
    } catch (const HangError&) {
      throw HangError(fmt::format("env:// rendezvous: rank {} joined rank 0 at {}:{} but the others did not all "
                                  "join within the deadline (STALLBENCH_RDZV_TIMEOUT, {} s)",
                                  rank(), l_.master_addr, l_.port, l_.timeout.count()));
    }
    if (f.first == Frame::error) throw_peer_error(f.second, 0);
    if (f.first != Frame::roster) throw Error(ErrorKind::runtime, "env:// rendezvous: rank 0 sent no roster");
    members_ = parse_rdzv_roster(f.second, size());
  }

  static int try_connect(addrinfo* a, Deadline d, std::string& last_error) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) return -1;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last_error = std::strerror(errno);
      ::close(fd);
      return -1;
    }
    if (!wait_fd(fd, POLLOUT, std::min(d, clock_type::now() + std::chrono::seconds(2)))) {
      last_error = "connect timed out";
      ::close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      last_error = std::strerror(err);
      ::close(fd);
      return -1;
    }
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }

  EnvLaunch l_;
  Member me_;
  std::vector<int> fds_;  // rank 0: one per peer; others: fds_[0], to rank 0
  std::vector<Member> members_;  // rank 0: by rank, as they joined; others: rank 0's roster
  int listen_fd_ = -1;
  int local_rank_ = 0, local_size_ = 1;
};

}  // namespace

std::string rdzv_hello_text(const RdzvMember& m) {
  return fmt::format("{}\n{}\n{}\n{}\n{}\n{}", m.rank, m.world, m.local_rank, m.pid, m.job, m.host);
}

std::optional<RdzvMember> parse_rdzv_hello(std::string_view payload) {
  const auto f = text::split(payload, '\n');
  if (f.size() != 6) return std::nullopt;
  const auto rank = text::parse_whole<int>(f[0]), world = text::parse_whole<int>(f[1]);
  const auto local = text::parse_whole<int>(f[2]);
  const auto pid = text::parse_whole<long long>(f[3]);
  if (!rank || !world || !local || !pid) return std::nullopt;
  RdzvMember m;
  m.rank = *rank;
  m.world = *world;
  m.local_rank = *local;
  m.pid = *pid;
  m.job = std::string(f[4]);
  m.host = std::string(f[5]);
  return m;
}

std::string rdzv_roster_text(const std::vector<RdzvMember>& members) {
  std::string text;
  for (const RdzvMember& m : members) text += rdzv_hello_text(m) + "\x1f";
  return text;
}

std::vector<RdzvMember> parse_rdzv_roster(std::string_view payload, int world) {
  std::vector<RdzvMember> out;
  for (const auto part : text::split(payload, '\x1f')) {
    if (part.empty()) continue;
    const auto m = parse_rdzv_hello(part);
    if (!m || m->rank < 0 || m->rank >= world || out.size() >= std::size_t(world))
      throw Error(ErrorKind::runtime, "env:// rendezvous: rank 0 sent a damaged roster");
    out.push_back(*m);
  }
  return out;
}

std::string pack_parts(const std::vector<std::string>& parts) {
  std::string packed;
  for (const auto& b : parts) packed += fmt::format("{}\n", b.size()) + b;
  return packed;
}

std::vector<std::string> unpack_parts(std::string_view packed, std::size_t max_parts) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at < packed.size() && out.size() < max_parts;) {
    const auto nl = packed.find('\n', at);
    const auto n = nl == std::string_view::npos ? std::nullopt : text::parse_whole<std::size_t>(packed.substr(at, nl - at));
    if (!n || *n > packed.size() - nl - 1) throw Error(ErrorKind::runtime, "gather: rank 0 sent a damaged frame");
    out.emplace_back(packed.substr(nl + 1, *n));
    at = nl + 1 + *n;
  }
  return out;
}

std::optional<EnvLaunch> detect_env_launch() {
  EnvLaunch l;
  const bool torch_vars = env("RANK") || env("WORLD_SIZE");
  const bool slurm_vars = env("SLURM_PROCID") && env("SLURM_NTASKS") && env("MASTER_ADDR");
  if (!torch_vars && !slurm_vars) return std::nullopt;
  if (torch_vars) {
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
      if (!env(v))
        throw UsageError(fmt::format("env:// launch: {} is set but {} is not (a torchrun-style launch sets RANK, "
                                     "WORLD_SIZE, MASTER_ADDR and MASTER_PORT)",
                                     env("RANK") ? "RANK" : "WORLD_SIZE", v));
    l.world_size = *env_int("WORLD_SIZE", 1, 1 << 20);
    l.rank = *env_int("RANK", 0, 1 << 20);
    if (l.rank >= l.world_size)
      throw UsageError(fmt::format("env:// launch: RANK={} is not below WORLD_SIZE={}", l.rank, l.world_size));
    l.local_rank = env_int("LOCAL_RANK", 0, 1 << 20).value_or(-1);
    l.local_world_size = env_int("LOCAL_WORLD_SIZE", 1, 1 << 20).value_or(-1);
    l.launcher = env("TORCHELASTIC_RUN_ID") ? "torchrun" : "env://";
    if (const char* id = env("TORCHELASTIC_RUN_ID")) l.job = id;
  } else {
    if (!env("MASTER_PORT"))
      throw UsageError("srun (env://): MASTER_ADDR is set but MASTER_PORT is not");
    l.world_size = *env_int("SLURM_NTASKS", 1, 1 << 20);
    l.rank = *env_int("SLURM_PROCID", 0, 1 << 20);
    if (l.rank >= l.world_size)
      throw UsageError(fmt::format("srun (env://): SLURM_PROCID={} is not below SLURM_NTASKS={}", l.rank, l.world_size));
    l.local_rank = env_int("SLURM_LOCALID", 0, 1 << 20).value_or(-1);
    l.launcher = "srun (env://)";
    if (const char* job = env("SLURM_JOB_ID")) l.job = fmt::format("{}.{}", job, env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "");
  }
  l.master_addr = env("MASTER_ADDR");
  const int master_port = *env_int("MASTER_PORT", 1, 65535);
  if (const auto p = env_int("STALLBENCH_RDZV_PORT", 1, 65535)) {
    l.port = *p;
    l.port_why = "STALLBENCH_RDZV_PORT";
  } else if (env("TORCHELASTIC_USE_AGENT_STORE") && std::string(env("TORCHELASTIC_USE_AGENT_STORE")) == "True") {
    // torchrun's agent serves its TCPStore on MASTER_PORT to the workers (checked with torch 2.15)
    if (master_port == 65535)
      throw UsageError("torchrun: MASTER_PORT is 65535, and MASTER_PORT + 1 (where rank 0 listens beside torchrun's "
                       "store) is no port: set STALLBENCH_RDZV_PORT");
    l.port = master_port + 1;
    l.port_why = "MASTER_PORT + 1: torchrun's agent store holds MASTER_PORT";
  } else {
    l.port = master_port;
    l.port_why = "MASTER_PORT";
  }
  if (const auto t = env_int("STALLBENCH_RDZV_TIMEOUT", 1, 86400)) l.timeout = std::chrono::seconds(*t);
  return l;
}

std::unique_ptr<ProcessGroup> open_env_process_group(const EnvLaunch& launch) {
  return std::make_unique<EnvProcessGroup>(launch);
}

}  // namespace sb
