// Where carpool keeps its catalog and socket. Thread-safe (reads the environment only).
#ifndef CARPOOL_DATASETS_STATE_DIR_H_
#define CARPOOL_DATASETS_STATE_DIR_H_

#include <filesystem>
#include <string_view>

#include "carpool/status.h"

namespace carpool {

// The --state-dir flag value (empty = unset), else $CARPOOL_STATE_DIR, else
// $XDG_STATE_HOME/carpool, else ~/.local/state/carpool. Creates the directory (mode 0700 for the
// leaf when it is new) and returns its absolute path.
Result<std::filesystem::path> ResolveStateDir(std::string_view flag_value);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_STATE_DIR_H_
