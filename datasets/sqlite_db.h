// A thin RAII layer over the SQLite C API: a connection, prepared statements and a transaction
// guard, all reporting Status. Thread-compatible: callers serialize access to one SqliteDb.
#ifndef CARPOOL_DATASETS_SQLITE_DB_H_
#define CARPOOL_DATASETS_SQLITE_DB_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "carpool/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace carpool {

class SqliteStmt {
 public:
  SqliteStmt() = default;
  SqliteStmt(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~SqliteStmt();
  SqliteStmt(SqliteStmt&& other) noexcept;
  SqliteStmt& operator=(SqliteStmt&& other) noexcept;
  SqliteStmt(const SqliteStmt&) = delete;
  SqliteStmt& operator=(const SqliteStmt&) = delete;

  // Parameters are 1-based, as in SQLite. Text and blobs are copied (SQLITE_TRANSIENT) unless
  // noted, so the arguments need not outlive the call.
  void BindInt(int index, int64_t value);
  void BindText(int index, std::string_view value);
  void BindBlob(int index, std::span<const uint8_t> value);

  // Advances one row: true while a row is available, false when done.
  Result<bool> Step();
  // Steps to completion, ignoring rows, then resets the statement for reuse.
  Status Run();
  // Clears the cursor (keeps bindings) so the statement can run again.
  void Reset();

  // Columns are 0-based. Text and blob views are valid until the next Step/Reset.
  int64_t ColumnInt(int col) const;
  std::string_view ColumnText(int col) const;
  std::span<const uint8_t> ColumnBlob(int col) const;

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

class SqliteDb {
 public:
  // Opens (creating if absent) the database file and sets a busy timeout, so that a second
  // process waits for a writer instead of failing at once.
  static Result<std::unique_ptr<SqliteDb>> Open(const std::filesystem::path& file);
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  Status Exec(std::string_view sql);
  Result<SqliteStmt> Prepare(std::string_view sql);
  // The first column of the first row of `sql`, which must return one integer.
  Result<int64_t> QueryInt(std::string_view sql);
  int Changes() const;
  const std::filesystem::path& file() const { return file_; }

 private:
  SqliteDb(sqlite3* db, std::filesystem::path file) : db_(db), file_(std::move(file)) {}
  sqlite3* db_;
  std::filesystem::path file_;
};

// BEGIN IMMEDIATE on construction via Begin(); rolls back in the destructor unless Commit() ran.
// A process killed inside the transaction leaves the database as it was before Begin().
class SqliteTransaction {
 public:
  static Result<SqliteTransaction> Begin(SqliteDb* db);
  ~SqliteTransaction();
  SqliteTransaction(SqliteTransaction&& other) noexcept : db_(other.db_) { other.db_ = nullptr; }
  SqliteTransaction& operator=(SqliteTransaction&&) = delete;
  Status Commit();

 private:
  explicit SqliteTransaction(SqliteDb* db) : db_(db) {}
  SqliteDb* db_;
};

}  // namespace carpool

#endif  // CARPOOL_DATASETS_SQLITE_DB_H_
