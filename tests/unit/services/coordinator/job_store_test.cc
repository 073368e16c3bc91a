#include "services/coordinator/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/grpc/auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream::services {
namespace {

using specstream::testing::FileExists;
using specstream::testing::ReadFile;
using specstream::testing::TempDir;
using specstream::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Job MakeJob(const std::string& id, v1::JobState state = v1::JOB_STATE_QUEUED) {
  v1::Job job;
  job.set_id(id);
  job.set_name("name-" + id);
  job.set_state(state);
  job.set_spec_yaml("model: tiny\n");
  job.set_world_size(2);
  job.set_created_unix_ms(1000);
  return job;
}

v1::JobEvent LogEvent(const std::string& job_id, const std::string& text) {
  v1::JobEvent event;
  event.set_job_id(job_id);
  event.mutable_log()->set_rank(0);
  event.mutable_log()->set_stream("stdout");
  event.mutable_log()->set_text(text);
  return event;
}

v1::JobEvent StateEvent(v1::JobState state) {
  v1::JobEvent event;  // job_id left empty: Update fills it
  event.mutable_state()->set_state(state);
  return event;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const v1::Job& job : jobs) ids.push_back(job.id());
  return ids;
}

std::vector<int64_t> Seqs(const std::vector<v1::JobEvent>& events) {
  std::vector<int64_t> seqs;
  for (const v1::JobEvent& event : events) seqs.push_back(event.seq());
  return seqs;
}

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.Join("coordinator.db");
    store_ = OpenStore();
  }

  std::unique_ptr<JobStore> OpenStore() {
    auto store = JobStore::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  TempDir dir_;
  std::string path_;
  std::unique_ptr<JobStore> store_;
};

TEST_F(JobStoreTest, InsertThenGetReturnsTheJobAndToken) {
  ASSERT_NE(store_, nullptr);
  v1::Job job = MakeJob("a");
  job.add_teachers("t0:50051");
  ASSERT_TRUE(store_->Insert(job, "secret-a").ok());

  auto got = store_->Get("a");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->SerializeAsString(), job.SerializeAsString());
  EXPECT_EQ(got->name(), "name-a");
  EXPECT_THAT(got->teachers(), ElementsAre("t0:50051"));

  auto token = store_->TokenHash("a");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "secret-a");
}

TEST_F(JobStoreTest, InsertWithoutIdIsInvalid) {
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->Insert(MakeJob(""), "t").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStoreTest, DuplicateIdIsAlreadyExistsAndKeepsTheFirst) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("dup"), "first").ok());
  v1::Job other = MakeJob("dup");
  other.set_name("other");
  absl::Status status = store_->Insert(other, "second");
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(status.message(), "job dup already exists");

  auto got = store_->Get("dup");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->name(), "name-dup");
  EXPECT_EQ(*store_->TokenHash("dup"), "first");
  EXPECT_EQ(store_->List(0)->size(), 1u);
}

TEST_F(JobStoreTest, UnknownIdIsNotFoundEverywhere) {
  ASSERT_NE(store_, nullptr);
  auto got = store_->Get("nope");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.status().message(), "job nope not found");
  EXPECT_EQ(store_->TokenHash("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Events("nope", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->LastSeq("nope").status().code(), absl::StatusCode::kNotFound);

  std::vector<v1::JobEvent> events = {StateEvent(v1::JOB_STATE_RUNNING)};
  absl::Status update = store_->Update(MakeJob("nope"), &events);
  EXPECT_EQ(update.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(update.message(), "job nope not found");
  EXPECT_EQ(events[0].seq(), 0) << "a failed update must not assign seqs";

  std::vector<v1::JobEvent> appended = {LogEvent("nope", "x")};
  EXPECT_EQ(store_->Append(appended).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStoreTest, ListIsNewestFirstWithLimit) {
  ASSERT_NE(store_, nullptr);
  // Ids out of alphabetical order: List must follow submission order.
  for (const char* id : {"m", "z", "a", "k"}) ASSERT_TRUE(store_->Insert(MakeJob(id), "t").ok());

  auto all = store_->List(0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Ids(*all), ElementsAre("k", "a", "z", "m"));

  auto two = store_->List(2);
  ASSERT_TRUE(two.ok());
  EXPECT_THAT(Ids(*two), ElementsAre("k", "a"));

  auto many = store_->List(100);
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(many->size(), 4u);

  EXPECT_EQ(store_->List(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStoreTest, ListPagePagesNewestFirstBelowTheLastJob) {
  ASSERT_NE(store_, nullptr);
  for (const char* id : {"m", "z", "a", "k", "b"}) {
    ASSERT_TRUE(store_->Insert(MakeJob(id), "t").ok());
  }
  std::vector<std::vector<std::string>> pages;
  int64_t before = 0;
  do {
    auto page = store_->ListPage(before, 2, 0);
    ASSERT_TRUE(page.ok()) << page.status();
    pages.push_back(Ids(page->jobs));
    before = page->next_before_ord;
    ASSERT_LE(pages.size(), 5u) << "pages never end";
  } while (before != 0);
  EXPECT_THAT(pages, ElementsAre(ElementsAre("b", "k"), ElementsAre("a", "z"), ElementsAre("m")));

  // A job submitted between pages does not shift the next page.
  auto first = store_->ListPage(0, 2, 0);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(store_->Insert(MakeJob("new"), "t").ok());
  auto second = store_->ListPage(first->next_before_ord, 2, 0);
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(Ids(second->jobs), ElementsAre("a", "z"));

  // Exactly `limit` jobs left: the page says so only by ending the next.
  auto all = store_->ListPage(0, 0, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs.size(), 6u);
  EXPECT_EQ(all->next_before_ord, 0);

  EXPECT_EQ(store_->ListPage(0, -1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->ListPage(-1, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStoreTest, ListPageLeavesOutSpecsAndStopsAtTheByteLimit) {
  ASSERT_NE(store_, nullptr);
  // Stored jobs far past any message limit: 8 MiB specs each.
  for (int i = 0; i < 3; ++i) {
    v1::Job job = MakeJob("big" + std::to_string(i));
    job.set_spec_yaml(std::string(8 << 20, 'x'));
    job.mutable_spec()->set_name(std::string(1 << 20, 'n'));
    ASSERT_TRUE(store_->Insert(job, "t").ok());
  }
  auto page = store_->ListPage(0, 0, 1 << 20);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(Ids(page->jobs), ElementsAre("big2", "big1", "big0"));
  for (const v1::Job& job : page->jobs) {
    EXPECT_TRUE(job.spec_yaml().empty());
    EXPECT_FALSE(job.has_spec());
    EXPECT_EQ(job.world_size(), 2);  // the rest is kept
  }
  EXPECT_EQ(store_->Get("big1")->spec_yaml().size(), size_t{8} << 20);  // Get keeps it

  // What a summary still carries (a long reason) counts against the limit:
  // 400 KiB each, so two fit in 1 MiB; a job over the limit alone still
  // comes back, on a page of its own.
  for (const char* id : {"r1", "r2", "r3"}) {
    v1::Job job = MakeJob(id);
    job.set_reason(std::string(400 << 10, 'r'));
    ASSERT_TRUE(store_->Insert(job, "t").ok());
  }
  v1::Job huge = MakeJob("huge");
  huge.set_reason(std::string(3 << 20, 'h'));
  ASSERT_TRUE(store_->Insert(huge, "t").ok());
  std::vector<std::vector<std::string>> pages;
  int64_t before = 0;
  do {
    auto next = store_->ListPage(before, 0, 1 << 20);
    ASSERT_TRUE(next.ok()) << next.status();
    pages.push_back(Ids(next->jobs));
    before = next->next_before_ord;
    ASSERT_LE(pages.size(), 10u) << "pages never end";
  } while (before != 0);
  EXPECT_THAT(pages, ElementsAre(ElementsAre("huge"), ElementsAre("r3", "r2"),
                                 ElementsAre("r1", "big2", "big1", "big0")));
}

TEST_F(JobStoreTest, InsertStoresTheJobAndItsFirstEventsTogether) {
  ASSERT_NE(store_, nullptr);
  std::vector<v1::JobEvent> events = {StateEvent(v1::JOB_STATE_QUEUED)};
  ASSERT_TRUE(store_->Insert(MakeJob("j"), "t", &events).ok());
  EXPECT_THAT(Seqs(events), ElementsAre(1));
  EXPECT_EQ(events[0].job_id(), "j");
  auto stored = store_->Events("j", 0);
  ASSERT_TRUE(stored.ok());
  EXPECT_THAT(Seqs(*stored), ElementsAre(1));

  // An event of another job refuses the whole insert.
  std::vector<v1::JobEvent> foreign = {LogEvent("other", "x")};
  EXPECT_EQ(store_->Insert(MakeJob("k"), "t", &foreign).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Get("k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(foreign[0].seq(), 0);
  // A taken id: nothing appended to the existing job either.
  std::vector<v1::JobEvent> again = {StateEvent(v1::JOB_STATE_QUEUED)};
  EXPECT_EQ(store_->Insert(MakeJob("j"), "t", &again).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Seqs(*store_->Events("j", 0)), ElementsAre(1));
}

TEST_F(JobStoreTest, ListActiveIsFifoAndFollowsUpdates) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("q2"), "t").ok());
  ASSERT_TRUE(store_->Insert(MakeJob("done", v1::JOB_STATE_SUCCEEDED), "t").ok());
  ASSERT_TRUE(store_->Insert(MakeJob("q1"), "t").ok());
  ASSERT_TRUE(store_->Insert(MakeJob("run", v1::JOB_STATE_RUNNING), "t").ok());

  auto active = store_->ListActive();
  ASSERT_TRUE(active.ok()) << active.status();
  EXPECT_THAT(Ids(*active), ElementsAre("q2", "q1", "run"));

  // The state column follows Update: q2 finishes, done is (oddly) requeued;
  // a requeued job keeps its submission position.
  ASSERT_TRUE(store_->Update(MakeJob("q2", v1::JOB_STATE_FAILED)).ok());
  ASSERT_TRUE(store_->Update(MakeJob("done", v1::JOB_STATE_QUEUED)).ok());
  active = store_->ListActive();
  ASSERT_TRUE(active.ok());
  EXPECT_THAT(Ids(*active), ElementsAre("done", "q1", "run"));
}

TEST_F(JobStoreTest, UpdateReplacesTheJob) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("j"), "tok").ok());
  v1::Job job = MakeJob("j", v1::JOB_STATE_RUNNING);
  job.set_attempt(3);
  job.set_reason("restarted");
  auto* rank = job.add_ranks();
  rank->set_rank(1);
  rank->set_daemon_id("d1");
  ASSERT_TRUE(store_->Update(job).ok());

  auto got = store_->Get("j");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->SerializeAsString(), job.SerializeAsString());
  EXPECT_EQ(got->attempt(), 3);
  EXPECT_EQ(*store_->TokenHash("j"), "tok") << "Update keeps the token";
}

TEST_F(JobStoreTest, SeqsAreGaplessAcrossUpdateAndAppend) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("a"), "t").ok());
  ASSERT_TRUE(store_->Insert(MakeJob("b"), "t").ok());
  EXPECT_EQ(*store_->LastSeq("a"), 0);
  EXPECT_TRUE(store_->Events("a", 0)->empty());

  std::vector<v1::JobEvent> first = {StateEvent(v1::JOB_STATE_RUNNING)};
  first[0].set_seq(77);  // ignored: the store numbers events
  ASSERT_TRUE(store_->Update(MakeJob("a", v1::JOB_STATE_RUNNING), &first).ok());
  EXPECT_EQ(first[0].seq(), 1);
  EXPECT_EQ(first[0].job_id(), "a") << "Update fills the job id";
  EXPECT_GT(first[0].unix_ms(), 0) << "unix_ms filled with now";

  // One Append over two jobs: each job counts on its own.
  std::vector<v1::JobEvent> batch = {LogEvent("a", "x"), LogEvent("b", "y"), LogEvent("a", "z")};
  batch[1].set_unix_ms(42);  // kept: only 0 is replaced
  ASSERT_TRUE(store_->Append(batch).ok());
  EXPECT_THAT(Seqs(batch), ElementsAre(2, 1, 3));
  EXPECT_EQ(batch[1].unix_ms(), 42);

  std::vector<v1::JobEvent> second = {StateEvent(v1::JOB_STATE_SUCCEEDED), LogEvent("", "bye")};
  ASSERT_TRUE(store_->Update(MakeJob("a", v1::JOB_STATE_SUCCEEDED), &second).ok());
  EXPECT_THAT(Seqs(second), ElementsAre(4, 5));

  auto events = store_->Events("a", 0);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_THAT(Seqs(*events), ElementsAre(1, 2, 3, 4, 5));
  for (const v1::JobEvent& event : *events) EXPECT_EQ(event.job_id(), "a");
  EXPECT_EQ((*events)[0].state().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*events)[2].log().text(), "z");
  EXPECT_EQ((*events)[4].log().text(), "bye");
  EXPECT_EQ(*store_->LastSeq("a"), 5);

  auto b_events = store_->Events("b", 0);
  ASSERT_TRUE(b_events.ok());
  ASSERT_EQ(b_events->size(), 1u);
  EXPECT_EQ((*b_events)[0].unix_ms(), 42);
  EXPECT_EQ(*store_->LastSeq("b"), 1);
}

TEST_F(JobStoreTest, BadEventsWriteNothing) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("a"), "t").ok());

  // A batch with one unknown job is refused as a whole.
  std::vector<v1::JobEvent> batch = {LogEvent("a", "x"), LogEvent("ghost", "y")};
  EXPECT_EQ(store_->Append(batch).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(batch[0].seq(), 0);
  EXPECT_EQ(*store_->LastSeq("a"), 0);

  std::vector<v1::JobEvent> no_job = {LogEvent("", "x")};
  EXPECT_EQ(store_->Append(no_job).code(), absl::StatusCode::kInvalidArgument);

  // Update with another job's event: neither the job nor the events change.
  std::vector<v1::JobEvent> foreign = {LogEvent("b", "x")};
  EXPECT_EQ(store_->Update(MakeJob("a", v1::JOB_STATE_RUNNING), &foreign).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Get("a")->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(*store_->LastSeq("a"), 0);

  std::vector<v1::JobEvent> empty;
  EXPECT_TRUE(store_->Append(empty).ok());
}

TEST_F(JobStoreTest, EventsAfterSeqWithLimit) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("a"), "t").ok());
  std::vector<v1::JobEvent> batch;
  for (int i = 1; i <= 10; ++i) batch.push_back(LogEvent("a", "line " + std::to_string(i)));
  ASSERT_TRUE(store_->Append(batch).ok());

  auto after3 = store_->Events("a", 3);
  ASSERT_TRUE(after3.ok());
  EXPECT_THAT(Seqs(*after3), ElementsAre(4, 5, 6, 7, 8, 9, 10));
  EXPECT_EQ((*after3)[0].log().text(), "line 4");

  auto page = store_->Events("a", 3, 2);
  ASSERT_TRUE(page.ok());
  EXPECT_THAT(Seqs(*page), ElementsAre(4, 5));

  auto tail = store_->Events("a", 8, 5);
  ASSERT_TRUE(tail.ok());
  EXPECT_THAT(Seqs(*tail), ElementsAre(9, 10));

  auto none = store_->Events("a", 10);
  ASSERT_TRUE(none.ok()) << "a known job with nothing new is not an error";
  EXPECT_TRUE(none->empty());

  EXPECT_EQ(store_->Events("a", 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStoreTest, DataSurvivesCloseAndReopen) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("old"), "tok-old").ok());
  ASSERT_TRUE(store_->Insert(MakeJob("new", v1::JOB_STATE_RUNNING), "tok-new").ok());
  std::vector<v1::JobEvent> events = {LogEvent("old", "1"), LogEvent("old", "2")};
  ASSERT_TRUE(store_->Append(events).ok());
  store_.reset();

  std::unique_ptr<JobStore> reopened = OpenStore();
  ASSERT_NE(reopened, nullptr);
  EXPECT_THAT(Ids(*reopened->List(0)), ElementsAre("new", "old"));
  EXPECT_THAT(Ids(*reopened->ListActive()), ElementsAre("old", "new"));
  EXPECT_EQ(*reopened->TokenHash("new"), "tok-new");
  EXPECT_EQ(reopened->Get("new")->state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(Seqs(*reopened->Events("old", 0)), ElementsAre(1, 2));

  // Numbering and submission order continue where they stopped.
  std::vector<v1::JobEvent> more = {LogEvent("old", "3")};
  ASSERT_TRUE(reopened->Append(more).ok());
  EXPECT_EQ(more[0].seq(), 3);
  ASSERT_TRUE(reopened->Insert(MakeJob("newest"), "t").ok());
  EXPECT_EQ(reopened->List(1)->at(0).id(), "newest");
  EXPECT_EQ(reopened->Insert(MakeJob("old"), "t").code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(JobStoreTest, DatabaseIsInWalMode) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("a"), "t").ok());
  // While a connection is open, committed writes sit in the -wal file.
  EXPECT_TRUE(FileExists(path_ + "-wal"));
  EXPECT_TRUE(FileExists(path_ + "-shm"));
  store_.reset();

  // WAL is persistent: the file header's read/write format versions (bytes
  // 18 and 19) are 2 for WAL, 1 for a rollback journal.
  const std::string header = ReadFile(path_);
  ASSERT_GE(header.size(), 100u);
  EXPECT_EQ(header.compare(0, 16, std::string("SQLite format 3\0", 16)), 0);
  EXPECT_EQ(header[18], 2);
  EXPECT_EQ(header[19], 2);
}

TEST_F(JobStoreTest, NewerSchemaVersionIsRefused) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("a"), "t").ok());
  store_.reset();  // checkpoints the WAL into the file

  // PRAGMA user_version is the big-endian int at offset 60 of the header.
  std::string bytes = ReadFile(path_);
  ASSERT_GE(bytes.size(), 100u);
  EXPECT_EQ(bytes.substr(60, 4), std::string("\0\0\0\2", 4)) << "schema version 2";
  bytes[63] = 99;
  WriteFile(path_, bytes);

  auto store = JobStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path_));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("schema version 99"));
}

TEST_F(JobStoreTest, ConcurrentAppendsGetDistinctGaplessSeqs) {
  ASSERT_NE(store_, nullptr);
  ASSERT_TRUE(store_->Insert(MakeJob("a"), "t").ok());
  constexpr int kPerThread = 100;

  // Two threads on this store, plus a second store (its own connection) on
  // the same file: BEGIN IMMEDIATE orders them too.
  std::unique_ptr<JobStore> second = OpenStore();
  ASSERT_NE(second, nullptr);
  JobStore* stores[] = {store_.get(), store_.get(), second.get()};
  std::vector<std::vector<int64_t>> seqs(3);
  std::vector<int> failures(3, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Alternate single events and pairs.
        std::vector<v1::JobEvent> events = {LogEvent("a", std::to_string(t))};
        if (i % 2 == 1) events.push_back(LogEvent("a", std::to_string(t)));
        if (!stores[t]->Append(events).ok()) {
          ++failures[t];
          continue;
        }
        for (const v1::JobEvent& event : events) seqs[t].push_back(event.seq());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(failures, ElementsAre(0, 0, 0));

  const int64_t total = 3 * (kPerThread + kPerThread / 2);
  std::vector<int64_t> all;
  for (int t = 0; t < 3; ++t) {
    EXPECT_TRUE(std::is_sorted(seqs[t].begin(), seqs[t].end())) << "thread " << t;
    all.insert(all.end(), seqs[t].begin(), seqs[t].end());
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(static_cast<int64_t>(all.size()), total);
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(all[i], i + 1) << "seqs must be 1..N, distinct";

  auto stored = store_->Events("a", 0);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(static_cast<int64_t>(stored->size()), total);
  for (int64_t i = 0; i < total; ++i) EXPECT_EQ((*stored)[i].seq(), i + 1);
  EXPECT_EQ(*second->LastSeq("a"), total);
}

TEST(JobStoreOpenTest, MissingDirectoryNamesThePath) {
  TempDir dir;
  const std::string path = dir.Join("no/such/dir/coordinator.db");
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path)) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("No such file or directory"));
}

TEST(JobStoreOpenTest, CorruptFileNamesThePath) {
  TempDir dir;
  const std::string path = dir.Join("garbage.db");
  WriteFile(path, std::string(4096, 'x'));
  auto store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a database"));
}

TEST(JobStoreOpenTest, DirectoryAsPathNamesThePath) {
  TempDir dir;
  auto store = JobStore::Open(dir.path());
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(dir.path())) << store.status();
}

TEST(JobStoreOpenTest, UnwritableDirectoryNamesThePath) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  const std::string locked = dir.Join("locked");
  ASSERT_EQ(mkdir(locked.c_str(), 0500), 0);
  const std::string path = locked + "/coordinator.db";
  auto store = JobStore::Open(path);
  chmod(locked.c_str(), 0700);  // so TempDir can remove it
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path)) << store.status();
}

TEST(JobStoreOpenTest, TheFileIsOwnerOnlyAndALooseOneIsTightened) {
  TempDir dir;
  const std::string fresh = dir.Join("fresh.db");
  ASSERT_TRUE(JobStore::Open(fresh).ok());
  struct stat st {};
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  const std::string loose = dir.Join("loose.db");
  WriteFile(loose, "");  // an empty file is an empty database
  ASSERT_EQ(chmod(loose.c_str(), 0644), 0);
  ASSERT_TRUE(JobStore::Open(loose).ok());
  ASSERT_EQ(stat(loose.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// A store written before tokens were hashed (schema 1) is migrated: the
// clear token is replaced by its hash, and the job is kept.
TEST(JobStoreOpenTest, ASchemaOneStoreHasItsTokensHashed) {
  TempDir dir;
  const std::string path = dir.Join("v1.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    const std::string blob = MakeJob("old").SerializeAsString();
    const std::string sql =
        "CREATE TABLE jobs (id TEXT PRIMARY KEY NOT NULL, ord INTEGER NOT NULL UNIQUE, "
        "state INTEGER NOT NULL, created_unix_ms INTEGER NOT NULL, token TEXT NOT NULL, "
        "job BLOB NOT NULL);"
        "CREATE TABLE events (job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE, "
        "seq INTEGER NOT NULL, unix_ms INTEGER NOT NULL, event BLOB NOT NULL, "
        "PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"
        "PRAGMA user_version=1;";
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_stmt* insert = nullptr;
    ASSERT_EQ(
        sqlite3_prepare_v2(db, "INSERT INTO jobs VALUES ('old', 1, 1, 1000, 'clear-token', ?1)", -1,
                           &insert, nullptr),
        SQLITE_OK);
    sqlite3_bind_blob(insert, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(insert), SQLITE_DONE);
    sqlite3_finalize(insert);
    sqlite3_close(db);
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->TokenHash("old"), TokenHash("clear-token"));
  EXPECT_EQ((*store)->Get("old")->name(), "name-old");
}

}  // namespace
}  // namespace specstream::services
