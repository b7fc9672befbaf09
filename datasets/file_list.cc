#include "datasets/file_list.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "datasets/file_resolver.h"
#include "datasets/image_dir.h"

namespace carpool {

namespace fs = std::filesystem;

namespace {

struct Entry {
  std::string path;
  std::string_view label;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Parses one non-blank line into `out`; false when it is malformed.
bool ParseLine(std::string_view line, Entry* out) {
  line = Trim(line);
  std::string_view rest;
  if (!line.empty() && line.front() == '"') {
    out->path.clear();
    size_t i = 1;
    for (; i < line.size(); ++i) {
      if (line[i] != '"') {
        out->path.push_back(line[i]);
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        out->path.push_back('"');
        ++i;
      } else {
        break;
      }
    }
    if (i >= line.size()) return false;  // no closing quote
    rest = Trim(line.substr(i + 1));
    if (rest.empty() || rest.front() != ',') return false;
    rest.remove_prefix(1);
  } else {
    size_t comma = line.rfind(',');
    if (comma == std::string_view::npos) return false;
    out->path = std::string(Trim(line.substr(0, comma)));
    rest = line.substr(comma + 1);
  }
  out->label = Trim(rest);
  return !out->path.empty() && !out->label.empty();
}

bool ParseInt(std::string_view s, int32_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size() && *v >= 0;
}

}  // namespace

Result<SourceScan> ReadFileList(const fs::path& list, const ProgressFn& progress) {
  std::error_code ec;
  fs::path canonical = fs::canonical(list, ec);
  std::ifstream in(canonical, std::ios::binary);
  if (ec || !in || fs::is_directory(canonical, ec)) {
    return Status::NotFound(fmt::format(
        "file list \"{}\" cannot be read; pass an existing CSV of path,label lines to --list",
        list.string()));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Entry> entries;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    std::string_view trimmed = Trim(line);
    if (trimmed.empty() || trimmed.front() == '#') continue;
    if (line_no == 1 && trimmed == "path,label") continue;
    Entry e;
    if (!ParseLine(line, &e)) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: malformed line \"{}\"; expected path,label (quote paths with commas)",
                      list.string(), line_no, trimmed.substr(0, 200)));
    }
    entries.push_back(std::move(e));
    if (progress && entries.size() % 65536 == 0) progress("reading list", entries.size(), 0);
  }
  SourceScan scan;
  scan.default_prepare = std::string(kImagePrepareDefault);
  scan.description = fmt::format("list {}", canonical.string());
  // Integer labels are used as they are; otherwise every label is a class name.
  bool integers = true;
  int32_t max_label = -1;
  for (const Entry& e : entries) {
    int32_t v = 0;
    if (!ParseInt(e.label, &v)) {
      integers = false;
      break;
    }
    max_label = std::max(max_label, v);
  }
  if (integers && max_label > kMaxIntegerLabel) {
    return Status::InvalidArgument(
        fmt::format("{}: label {} is larger than {}; use labels 0..K-1 or class names",
                    list.string(), max_label, kMaxIntegerLabel));
  }
  std::vector<RawFile> files(entries.size());
  if (integers) {
    for (int32_t c = 0; c <= max_label; ++c) scan.classes.push_back(std::to_string(c));
    for (size_t i = 0; i < entries.size(); ++i) {
      (void)ParseInt(entries[i].label, &files[i].label);
    }
  } else {
    std::map<std::string_view, int32_t> names;
    for (const Entry& e : entries) names.emplace(e.label, 0);
    for (auto& [name, index] : names) {
      index = static_cast<int32_t>(scan.classes.size());
      scan.classes.emplace_back(name);
    }
    for (size_t i = 0; i < entries.size(); ++i) files[i].label = names[entries[i].label];
  }
  for (size_t i = 0; i < entries.size(); ++i) files[i].path = std::move(entries[i].path);
  entries.clear();
  Status s = ResolveFiles(std::move(files), canonical.parent_path(), &scan, progress);
  if (!s.ok()) return s;
  return scan;
}

}  // namespace carpool
