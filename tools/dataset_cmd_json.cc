// `carpool dataset ... --json`: one JSON object on stdout per run, the errors included, so that a
// program (the Python package's carpool.datasets) reads one stream and needs no catalog of its own.
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tools/dataset_cmd.h"

namespace carpool::tools {

namespace {
bool json_output = false;  // set once by the dispatcher, before any verb runs
}  // namespace

void SetJsonOutput(bool on) { json_output = on; }
bool JsonOutput() { return json_output; }

void PrintJson(const nlohmann::json& object) {
  // Replacement of invalid UTF-8 (a file name from disk) rather than an exception mid-print.
  fmt::print("{}\n", object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void PrintJsonError(std::string_view verb, const Status& status, bool usage) {
  PrintJson({{"error", status.message()},
             {"code", static_cast<int>(status.code())},
             {"status", std::string(StatusCodeName(status.code()))},
             {"usage", usage},
             {"verb", std::string(verb)}});
}

nlohmann::json DatasetJson(const DatasetInfo& d) {
  nlohmann::json ids = nlohmann::json::array();
  if (!d.ids.isEmpty()) ids = {d.ids.minimum(), d.ids.maximum()};
  return {{"name", d.name},
          {"samples", d.ids.cardinality()},
          {"ids", ids},
          {"classes", d.classes},
          {"prepare", d.prepare_spec},
          {"source", d.source_desc},
          {"created_unix", d.created_unix}};
}

}  // namespace carpool::tools
