#include "services/coordinator/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "common/grpc/auth.h"
#include "common/logging.h"
#include "common/status.h"

namespace specstream::services {
namespace {

// Bumped whenever the schema changes; stored in PRAGMA user_version. A file
// written by a newer coordinator is refused rather than misread. Version 2:
// jobs.token holds the token's SHA-256 (TokenHash), no longer the token;
// Init migrates a version 1 file in place.
constexpr int kSchemaVersion = 2;

// How long a writer waits for another connection's write lock (another
// process on the same file) before SQLITE_BUSY.
constexpr int kBusyTimeoutMs = 5000;

// Executed once, inside the transaction that sets user_version. Submission
// order is its own column (`ord`, next = max + 1 under the write lock) so that
// `id` can stay the primary key; jobs are never deleted, so it only grows.
constexpr const char* kCreateSchemaSql = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY NOT NULL,
  ord INTEGER NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  token TEXT NOT NULL,  -- TokenHash of the job token, never the token
  job BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state_ord ON jobs (state, ord);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  unix_ms INTEGER NOT NULL,
  event BLOB NOT NULL,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
)sql";

// SQLite result codes to absl codes: what a caller can act on (retry a busy
// database, report a full disk) keeps its meaning; the rest is Internal.
absl::StatusCode CodeFor(int rc) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    case SQLITE_FULL:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
      return absl::StatusCode::kPermissionDenied;
    case SQLITE_CANTOPEN:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

// A copy of `events` (none when null) with empty job ids set to `job`'s;
// another job's event is InvalidArgument naming the `verb` ("insert").
absl::StatusOr<std::vector<v1::JobEvent>> EventsOf(const v1::Job& job,
                                                   const std::vector<v1::JobEvent>* events,
                                                   absl::string_view verb) {
  std::vector<v1::JobEvent> pending;
  if (events == nullptr) return pending;
  pending = *events;
  for (v1::JobEvent& event : pending) {
    if (event.job_id().empty()) event.set_job_id(job.id());
    if (event.job_id() != job.id()) {
      return absl::InvalidArgumentError(
          absl::StrCat(verb, " of job ", job.id(), " carries an event of job ", event.job_id()));
    }
  }
  return pending;
}

absl::Status JobNotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
}

// A repeated message field's per-element framing: one tag byte and a varint
// length of at most 5 bytes (messages are under 2 GiB).
constexpr size_t kRepeatedFieldOverhead = 6;

// A cached prepared statement borrowed for one use: bind, step, then on
// destruction reset and clear its bindings so the next user starts clean.
class Stmt final {
 public:
  explicit Stmt(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~Stmt() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  sqlite3_stmt* get() const { return stmt_; }

  // Binds copy their argument (SQLITE_TRANSIENT): callers' temporaries may
  // die before the step.
  int Bind(int index, int64_t value) { return sqlite3_bind_int64(stmt_, index, value); }
  int Bind(int index, const std::string& value) {
    return sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()),
                             SQLITE_TRANSIENT);
  }
  int BindBlob(int index, const std::string& value) {
    return sqlite3_bind_blob(stmt_, index, value.data(), static_cast<int>(value.size()),
                             SQLITE_TRANSIENT);
  }

  int64_t ColumnInt(int column) const { return sqlite3_column_int64(stmt_, column); }
  // Text and blob columns alike, as bytes.
  std::string ColumnBytes(int column) const {
    const void* data = sqlite3_column_blob(stmt_, column);
    const int size = sqlite3_column_bytes(stmt_, column);
    if (data == nullptr || size <= 0) return std::string();
    return std::string(static_cast<const char*>(data), static_cast<size_t>(size));
  }

 private:
  sqlite3_stmt* stmt_;
};

}  // namespace

struct JobStore::Impl {
  Impl(std::string path_in, Env& clock_in) : path(std::move(path_in)), clock(clock_in) {}
  ~Impl() {
    absl::MutexLock lock(&mu);
    for (auto& [sql, stmt] : statements) sqlite3_finalize(stmt);
    statements.clear();
    // The last connection to close checkpoints the WAL into the database
    // file and removes -wal / -shm.
    if (db != nullptr && sqlite3_close(db) != SQLITE_OK) {
      SS_LOG_WARN("job store {}: close failed: {}", path, sqlite3_errmsg(db));
    }
    db = nullptr;
  }

  const std::string path;
  Env& clock;  // the events' times
  absl::Mutex mu;
  sqlite3* db ABSL_GUARDED_BY(mu) = nullptr;
  // Prepared once per SQL text, reused for the store's lifetime. A Stmt
  // borrows the cached statement, so one SQL text must not be in use twice
  // at once (no nesting of the same query).
  std::unordered_map<std::string, sqlite3_stmt*> statements ABSL_GUARDED_BY(mu);

  // "<path>: <what>: <sqlite message>", with the code mapped from `rc`.
  absl::Status Error(int rc, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const char* message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    return absl::Status(CodeFor(rc), absl::StrCat(path, ": ", what, ": ", message));
  }

  absl::StatusOr<std::unique_ptr<Stmt>> Prepare(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = statements.find(sql);
    if (it == statements.end()) {
      sqlite3_stmt* stmt = nullptr;
      const int rc = sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
      if (rc != SQLITE_OK) return Error(rc, absl::StrCat("prepare \"", sql, "\""));
      it = statements.emplace(sql, stmt).first;
    }
    return std::make_unique<Stmt>(it->second);
  }

  // Runs `sql` (one or more statements, no parameters, rows ignored).
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return Error(rc, sql);
    return absl::OkStatus();
  }

  // Steps a statement expected to finish without rows (INSERT / UPDATE).
  absl::Status StepDone(Stmt& stmt, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int rc = sqlite3_step(stmt.get());
    if (rc != SQLITE_DONE) return Error(rc, what);
    return absl::OkStatus();
  }

  // Steps once: true on a row, false when done.
  absl::StatusOr<bool> StepRow(Stmt& stmt, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int rc = sqlite3_step(stmt.get());
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return Error(rc, what);
  }

  // A single integer from a parameterless query (pragmas).
  absl::StatusOr<int64_t> QueryInt(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ASSIGN_OR_RETURN(auto stmt, Prepare(sql));
    ASSIGN_OR_RETURN(const bool row, StepRow(*stmt, sql));
    if (!row) return absl::InternalError(absl::StrCat(path, ": ", sql, ": no result"));
    return stmt->ColumnInt(0);
  }

  // BEGIN IMMEDIATE takes the write lock up front (waiting up to the busy
  // timeout), so the seq read inside `body` cannot be raced by another
  // connection; ROLLBACK on any error, including a failed COMMIT.
  template <typename Body>
  absl::Status InTransaction(Body&& body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::Status status = body();
    if (status.ok()) status = Exec("COMMIT");
    if (!status.ok() && !sqlite3_get_autocommit(db)) {
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    }
    return status;
  }

  absl::StatusOr<bool> JobExists(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ASSIGN_OR_RETURN(auto stmt, Prepare("SELECT 1 FROM jobs WHERE id = ?1"));
    stmt->Bind(1, id);
    return StepRow(*stmt, "look up job");
  }

  absl::StatusOr<int64_t> LastSeqLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ASSIGN_OR_RETURN(auto stmt,
                     Prepare("SELECT IFNULL(MAX(seq), 0) FROM events WHERE job_id = ?1"));
    stmt->Bind(1, job_id);
    ASSIGN_OR_RETURN(const bool row, StepRow(*stmt, "read last seq"));
    return row ? stmt->ColumnInt(0) : 0;
  }

  // Inside a transaction: numbers `events` after each job's last seq and
  // stores them. Nothing is written back to `events` here; the caller copies
  // `stored` back only once the transaction committed, so a failed write
  // leaves the caller's events as they were.
  absl::Status InsertEvents(const std::vector<v1::JobEvent>& events,
                            std::vector<v1::JobEvent>* stored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::map<std::string, int64_t> next_seq;
    const int64_t now = absl::ToUnixMillis(clock.Now());
    stored->clear();
    stored->reserve(events.size());
    for (const v1::JobEvent& original : events) {
      if (original.job_id().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": event without job_id"));
      }
      auto it = next_seq.find(original.job_id());
      if (it == next_seq.end()) {
        ASSIGN_OR_RETURN(const bool exists, JobExists(original.job_id()));
        if (!exists) return JobNotFound(original.job_id());
        ASSIGN_OR_RETURN(const int64_t last, LastSeqLocked(original.job_id()));
        it = next_seq.emplace(original.job_id(), last + 1).first;
      }
      v1::JobEvent& event = stored->emplace_back(original);
      event.set_seq(it->second++);
      if (event.unix_ms() == 0) event.set_unix_ms(now);

      std::string blob;
      if (!event.SerializeToString(&blob)) {
        return absl::InternalError(absl::StrCat(path, ": cannot serialize event"));
      }
      ASSIGN_OR_RETURN(auto stmt, Prepare("INSERT INTO events (job_id, seq, unix_ms, event) "
                                          "VALUES (?1, ?2, ?3, ?4)"));
      stmt->Bind(1, event.job_id());
      stmt->Bind(2, event.seq());
      stmt->Bind(3, event.unix_ms());
      stmt->BindBlob(4, blob);
      RETURN_IF_ERROR(StepDone(*stmt, "insert event"));
    }
    return absl::OkStatus();
  }

  template <typename Message>
  absl::StatusOr<Message> Parse(const std::string& bytes, const std::string& what) {
    Message message;
    if (!message.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat(path, ": stored ", what, " does not parse"));
    }
    return message;
  }

  // Runs a query whose column 0 is a serialized v1::Job.
  absl::StatusOr<std::vector<v1::Job>> ReadJobs(Stmt& stmt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<v1::Job> jobs;
    while (true) {
      ASSIGN_OR_RETURN(const bool row, StepRow(stmt, "list jobs"));
      if (!row) break;
      ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(stmt.ColumnBytes(0), "job"));
      jobs.push_back(std::move(job));
    }
    return jobs;
  }

  // Version 1 -> 2: replaces each stored token with its hash (in Init's
  // transaction, so a crash leaves version 1 and clear tokens, never a mix).
  absl::Status MigrateTokensToHashes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<std::pair<std::string, std::string>> rows;
    {
      ASSIGN_OR_RETURN(auto stmt, Prepare("SELECT id, token FROM jobs"));
      while (true) {
        ASSIGN_OR_RETURN(const bool row, StepRow(*stmt, "read tokens"));
        if (!row) break;
        rows.emplace_back(stmt->ColumnBytes(0), stmt->ColumnBytes(1));
      }
    }
    for (const auto& [id, token] : rows) {
      ASSIGN_OR_RETURN(auto stmt, Prepare("UPDATE jobs SET token = ?2 WHERE id = ?1"));
      stmt->Bind(1, id);
      stmt->Bind(2, specstream::TokenHash(token));
      RETURN_IF_ERROR(StepDone(*stmt, "hash token"));
    }
    SS_LOG_INFO("job store {}: schema 1 -> 2, {} job token(s) replaced by their hashes", path,
                rows.size());
    return Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str());
  }

  // Connection settings and schema; run once from Open.
  absl::Status Init() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // sqlite3_busy_timeout is what PRAGMA busy_timeout sets.
    sqlite3_busy_timeout(db, kBusyTimeoutMs);
    // The first statement is where a file that is not a database is noticed.
    {
      ASSIGN_OR_RETURN(auto stmt, Prepare("PRAGMA journal_mode=WAL"));
      ASSIGN_OR_RETURN(const bool row, StepRow(*stmt, "PRAGMA journal_mode=WAL"));
      const std::string mode = row ? stmt->ColumnBytes(0) : std::string();
      if (mode != "wal") {
        return absl::FailedPreconditionError(
            absl::StrCat(path, ": cannot switch to WAL journal mode (got \"", mode, "\")"));
      }
    }
    RETURN_IF_ERROR(Exec("PRAGMA synchronous=NORMAL"));
    RETURN_IF_ERROR(Exec("PRAGMA foreign_keys=ON"));

    return InTransaction([&]() -> absl::Status {
      mu.AssertHeld();  // InTransaction runs the body under the lock
      ASSIGN_OR_RETURN(const int64_t version, QueryInt("PRAGMA user_version"));
      if (version == kSchemaVersion) return absl::OkStatus();
      if (version == 1) return MigrateTokensToHashes();
      if (version != 0) {
        return absl::FailedPreconditionError(absl::StrCat(path, ": schema version ", version,
                                                          " is not supported (this build reads ",
                                                          kSchemaVersion, ")"));
      }
      RETURN_IF_ERROR(Exec(kCreateSchemaSql));
      return Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str());
    });
  }
};

JobStore::JobStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

JobStore::~JobStore() = default;

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path, Env* clock) {
  // Owner-only before SQLite first opens it: the store holds job specs and
  // logs. SQLite gives its -wal and -shm files the database file's mode.
  {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus("open", path);
    struct stat st {};
    const bool loose = fstat(fd, &st) == 0 && (st.st_mode & 077) != 0;
    if (loose && fchmod(fd, 0600) != 0) {
      absl::Status status = ErrnoStatus("chmod 0600", path);
      close(fd);
      return status;
    }
    close(fd);
    if (loose) {
      // An older store's journal files kept the old mode.
      for (const char* suffix : {"-wal", "-shm"}) chmod((path + suffix).c_str(), 0600);
      SS_LOG_WARN("job store {}: was readable by others; now mode 0600", path);
    }
  }
  auto impl = std::make_unique<Impl>(path, Env::Or(clock));
  absl::MutexLock lock(&impl->mu);
  // NOMUTEX: the connection is only used under impl->mu.
  const int rc =
      sqlite3_open_v2(path.c_str(), &impl->db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) return impl->Error(rc, "open");  // ~Impl closes the handle
  RETURN_IF_ERROR(impl->Init());
  SS_LOG_INFO("job store {} open (schema version {})", path, kSchemaVersion);
  return std::unique_ptr<JobStore>(new JobStore(std::move(impl)));
}

absl::Status JobStore::Insert(const v1::Job& job, const std::string& token_hash,
                              std::vector<v1::JobEvent>* events) {
  if (job.id().empty()) return absl::InvalidArgumentError("job without id");
  ASSIGN_OR_RETURN(std::vector<v1::JobEvent> pending, EventsOf(job, events, "insert"));
  std::string blob;
  if (!job.SerializeToString(&blob)) {
    return absl::InternalError(absl::StrCat("cannot serialize job ", job.id()));
  }
  std::vector<v1::JobEvent> stored;
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  RETURN_IF_ERROR(s.InTransaction([&]() -> absl::Status {
    s.mu.AssertHeld();  // InTransaction runs the body under the lock
    ASSIGN_OR_RETURN(const bool exists, s.JobExists(job.id()));
    if (exists) return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), " already exists"));
    {
      ASSIGN_OR_RETURN(auto stmt,
                       s.Prepare("INSERT INTO jobs (id, ord, state, created_unix_ms, token, job) "
                                 "VALUES (?1, (SELECT IFNULL(MAX(ord), 0) + 1 FROM jobs), "
                                 "?2, ?3, ?4, ?5)"));
      stmt->Bind(1, job.id());
      stmt->Bind(2, static_cast<int64_t>(job.state()));
      stmt->Bind(3, job.created_unix_ms());
      stmt->Bind(4, token_hash);
      stmt->BindBlob(5, blob);
      RETURN_IF_ERROR(s.StepDone(*stmt, "insert job"));
    }
    return s.InsertEvents(pending, &stored);
  }));
  if (events != nullptr) *events = std::move(stored);
  return absl::OkStatus();
}

absl::Status JobStore::SetTokenHash(const std::string& id, const std::string& token_hash) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  ASSIGN_OR_RETURN(auto stmt, s.Prepare("UPDATE jobs SET token = ?2 WHERE id = ?1"));
  stmt->Bind(1, id);
  stmt->Bind(2, token_hash);
  RETURN_IF_ERROR(s.StepDone(*stmt, "set token hash"));
  if (sqlite3_changes(s.db) == 0) return JobNotFound(id);
  return absl::OkStatus();
}

absl::Status JobStore::Update(const v1::Job& job, std::vector<v1::JobEvent>* events) {
  ASSIGN_OR_RETURN(std::vector<v1::JobEvent> pending, EventsOf(job, events, "update"));
  std::string blob;
  if (!job.SerializeToString(&blob)) {
    return absl::InternalError(absl::StrCat("cannot serialize job ", job.id()));
  }
  std::vector<v1::JobEvent> stored;
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  RETURN_IF_ERROR(s.InTransaction([&]() -> absl::Status {
    s.mu.AssertHeld();  // InTransaction runs the body under the lock
    ASSIGN_OR_RETURN(auto stmt, s.Prepare("UPDATE jobs SET state = ?2, job = ?3 WHERE id = ?1"));
    stmt->Bind(1, job.id());
    stmt->Bind(2, static_cast<int64_t>(job.state()));
    stmt->BindBlob(3, blob);
    RETURN_IF_ERROR(s.StepDone(*stmt, "update job"));
    if (sqlite3_changes(s.db) == 0) return JobNotFound(job.id());
    return s.InsertEvents(pending, &stored);
  }));
  if (events != nullptr) *events = std::move(stored);
  return absl::OkStatus();
}

absl::Status JobStore::Append(std::vector<v1::JobEvent>& events) {
  if (events.empty()) return absl::OkStatus();
  std::vector<v1::JobEvent> stored;
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  RETURN_IF_ERROR(s.InTransaction([&] {
    s.mu.AssertHeld();  // InTransaction runs the body under the lock
    return s.InsertEvents(events, &stored);
  }));
  events = std::move(stored);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobStore::Get(const std::string& id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  ASSIGN_OR_RETURN(auto stmt, s.Prepare("SELECT job FROM jobs WHERE id = ?1"));
  stmt->Bind(1, id);
  ASSIGN_OR_RETURN(const bool row, s.StepRow(*stmt, "get job"));
  if (!row) return JobNotFound(id);
  return s.Parse<v1::Job>(stmt->ColumnBytes(0), absl::StrCat("job ", id));
}

absl::StatusOr<std::string> JobStore::TokenHash(const std::string& id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  ASSIGN_OR_RETURN(auto stmt, s.Prepare("SELECT token FROM jobs WHERE id = ?1"));
  stmt->Bind(1, id);
  ASSIGN_OR_RETURN(const bool row, s.StepRow(*stmt, "get token"));
  if (!row) return JobNotFound(id);
  return stmt->ColumnBytes(0);
}

absl::StatusOr<std::vector<v1::Job>> JobStore::List(int limit) {
  if (limit < 0) return absl::InvalidArgumentError(absl::StrCat("negative limit ", limit));
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  ASSIGN_OR_RETURN(auto stmt, s.Prepare("SELECT job FROM jobs ORDER BY ord DESC LIMIT ?1"));
  stmt->Bind(1, limit == 0 ? int64_t{-1} : int64_t{limit});  // SQLite: negative = no limit
  return s.ReadJobs(*stmt);
}

absl::StatusOr<JobStore::Page> JobStore::ListPage(int64_t before_ord, int limit, size_t max_bytes) {
  if (limit < 0) return absl::InvalidArgumentError(absl::StrCat("negative limit ", limit));
  if (before_ord < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative submission number ", before_ord));
  }
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  ASSIGN_OR_RETURN(auto stmt, s.Prepare("SELECT ord, job FROM jobs WHERE ord < ?1 "
                                        "ORDER BY ord DESC"));
  stmt->Bind(1, before_ord == 0 ? std::numeric_limits<int64_t>::max() : before_ord);
  Page page;
  size_t bytes = 0;
  int64_t last_ord = 0;
  while (true) {
    ASSIGN_OR_RETURN(const bool row, s.StepRow(*stmt, "list jobs"));
    if (!row) return page;  // the last page: next_before_ord stays 0
    // A row past the count limit only tells that more follow (its blob is
    // never read).
    if (limit > 0 && page.jobs.size() == static_cast<size_t>(limit)) break;
    const int64_t ord = stmt->ColumnInt(0);
    ASSIGN_OR_RETURN(v1::Job job, s.Parse<v1::Job>(stmt->ColumnBytes(1), "job"));
    job.clear_spec_yaml();
    job.clear_spec();
    // The job's bytes in the response: the message, its tag and its length.
    const size_t size = job.ByteSizeLong() + kRepeatedFieldOverhead;
    if (max_bytes > 0 && !page.jobs.empty() && bytes + size > max_bytes) break;
    bytes += size;
    last_ord = ord;
    page.jobs.push_back(std::move(job));
  }
  page.next_before_ord = last_ord;
  return page;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::ListActive() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  ASSIGN_OR_RETURN(auto stmt, s.Prepare("SELECT job FROM jobs WHERE state IN (?1, ?2) "
                                        "ORDER BY ord ASC"));
  stmt->Bind(1, static_cast<int64_t>(v1::JOB_STATE_QUEUED));
  stmt->Bind(2, static_cast<int64_t>(v1::JOB_STATE_RUNNING));
  return s.ReadJobs(*stmt);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::Events(const std::string& job_id,
                                                           int64_t after_seq, int limit) {
  if (limit < 0) return absl::InvalidArgumentError(absl::StrCat("negative limit ", limit));
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  std::vector<v1::JobEvent> events;
  {
    ASSIGN_OR_RETURN(auto stmt, s.Prepare("SELECT event FROM events WHERE job_id = ?1 AND "
                                          "seq > ?2 ORDER BY seq ASC LIMIT ?3"));
    stmt->Bind(1, job_id);
    stmt->Bind(2, after_seq);
    stmt->Bind(3, limit == 0 ? int64_t{-1} : int64_t{limit});
    while (true) {
      ASSIGN_OR_RETURN(const bool row, s.StepRow(*stmt, "read events"));
      if (!row) break;
      ASSIGN_OR_RETURN(
          v1::JobEvent event,
          s.Parse<v1::JobEvent>(stmt->ColumnBytes(0), absl::StrCat("event of job ", job_id)));
      events.push_back(std::move(event));
    }
  }
  // Only an empty answer needs telling apart "no new events" from "no job"
  // (events of a job exist only while the job does).
  if (events.empty()) {
    ASSIGN_OR_RETURN(const bool exists, s.JobExists(job_id));
    if (!exists) return JobNotFound(job_id);
  }
  return events;
}

absl::StatusOr<int64_t> JobStore::LastSeq(const std::string& job_id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  ASSIGN_OR_RETURN(const int64_t last, s.LastSeqLocked(job_id));
  if (last == 0) {
    ASSIGN_OR_RETURN(const bool exists, s.JobExists(job_id));
    if (!exists) return JobNotFound(job_id);
  }
  return last;
}

}  // namespace specstream::services
