#include "datasets/sqlite_db.h"

#include <fmt/core.h>
#include <sqlite3.h>

#include <utility>

namespace carpool {

namespace {

Status SqliteError(sqlite3* db, std::string_view what) {
  return Status::IOError(fmt::format("catalog {}: {} (sqlite code {})", what,
                                     db ? sqlite3_errmsg(db) : "out of memory",
                                     db ? sqlite3_extended_errcode(db) : SQLITE_NOMEM));
}

}  // namespace

SqliteStmt::~SqliteStmt() {
  if (stmt_ != nullptr) sqlite3_finalize(stmt_);
}

SqliteStmt::SqliteStmt(SqliteStmt&& other) noexcept
    : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)) {}

SqliteStmt& SqliteStmt::operator=(SqliteStmt&& other) noexcept {
  if (this != &other) {
    if (stmt_ != nullptr) sqlite3_finalize(stmt_);
    db_ = other.db_;
    stmt_ = std::exchange(other.stmt_, nullptr);
  }
  return *this;
}

void SqliteStmt::BindInt(int index, int64_t value) { sqlite3_bind_int64(stmt_, index, value); }

void SqliteStmt::BindText(int index, std::string_view value) {
  sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
}

void SqliteStmt::BindBlob(int index, std::span<const uint8_t> value) {
  // A zero-length blob with a null pointer would bind NULL; keep it a blob.
  static const uint8_t kEmpty = 0;
  sqlite3_bind_blob64(stmt_, index, value.empty() ? &kEmpty : value.data(), value.size(),
                      SQLITE_TRANSIENT);
}

Result<bool> SqliteStmt::Step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  Status s = SqliteError(db_, fmt::format("statement \"{}\" failed", sqlite3_sql(stmt_)));
  sqlite3_reset(stmt_);
  return s;
}

Status SqliteStmt::Run() {
  while (true) {
    Result<bool> row = Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
  }
  sqlite3_reset(stmt_);
  return Status::OK();
}

void SqliteStmt::Reset() { sqlite3_reset(stmt_); }

int64_t SqliteStmt::ColumnInt(int col) const { return sqlite3_column_int64(stmt_, col); }

std::string_view SqliteStmt::ColumnText(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  if (p == nullptr) return {};
  return {reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col))};
}

std::span<const uint8_t> SqliteStmt::ColumnBlob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  if (p == nullptr) return {};
  return {static_cast<const uint8_t*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col))};
}

Result<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::filesystem::path& file) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(file.c_str(), &db,
                           // NOMUTEX: callers serialize use of a connection (thread-compatible),
                           // so SQLite's own per-call mutex is pure cost on a million-row read.
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    Status s = Status::IOError(fmt::format(
        "cannot open catalog \"{}\": {}; check that the state dir is writable (--state-dir)",
        file.string(), db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 10000);
  sqlite3_extended_result_codes(db, 1);
  return std::unique_ptr<SqliteDb>(new SqliteDb(db, file));
}

SqliteDb::~SqliteDb() { sqlite3_close_v2(db_); }

Status SqliteDb::Exec(std::string_view sql) {
  std::string text(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return Status::OK();
  Status s = Status::IOError(fmt::format("catalog \"{}\": \"{}\" failed: {}", file_.string(), text,
                                         err ? err : sqlite3_errstr(rc)));
  sqlite3_free(err);
  return s;
}

Result<SqliteStmt> SqliteDb::Prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, fmt::format("cannot prepare \"{}\"", sql));
  return SqliteStmt(db_, stmt);
}

Result<int64_t> SqliteDb::QueryInt(std::string_view sql) {
  Result<SqliteStmt> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  Result<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return Status::Internal(fmt::format("catalog query \"{}\" returned no row", sql));
  return stmt->ColumnInt(0);
}

int SqliteDb::Changes() const { return sqlite3_changes(db_); }

Result<SqliteTransaction> SqliteTransaction::Begin(SqliteDb* db) {
  Status s = db->Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  return SqliteTransaction(db);
}

SqliteTransaction::~SqliteTransaction() {
  if (db_ != nullptr) (void)db_->Exec("ROLLBACK");
}

Status SqliteTransaction::Commit() {
  SqliteDb* db = std::exchange(db_, nullptr);
  Status s = db->Exec("COMMIT");
  if (!s.ok()) (void)db->Exec("ROLLBACK");
  return s;
}

}  // namespace carpool
