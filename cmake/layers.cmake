# Each folder is a layer whose headers are included as "folder/file.h". Instead of the repository
# root, a target gets an include root per layer (build/layers/<folder>/<folder> -> the source
# folder): its own folder's, and through target_link_libraries those of the libraries it links.
# An include of a layer the target does not link is then "No such file": a build error.

find_package(Python3 COMPONENTS Interpreter REQUIRED)

# Runs before any library compiles: includes and links between folders against the allowed table.
add_custom_target(carpool_check_layers
  COMMAND Python3::Interpreter ${CMAKE_CURRENT_LIST_DIR}/check_layers.py ${PROJECT_SOURCE_DIR}
  COMMENT "Checking includes and links between folders (cmake/check_layers.py)"
  VERBATIM)

# The include root that exposes exactly one folder.
function(carpool_layer_root out folder)
  set(root ${PROJECT_BINARY_DIR}/layers/${folder})
  if(NOT EXISTS ${root}/${folder})
    file(MAKE_DIRECTORY ${root})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${root}/${folder} SYMBOLIC)
  endif()
  set(${out} ${root} PARENT_SCOPE)
endfunction()

# add_subdirectory(folder) whose targets see their own folder's headers and nothing else of ours.
function(carpool_add_layer folder)
  carpool_layer_root(root ${folder})
  get_directory_property(saved INCLUDE_DIRECTORIES)
  set_directory_properties(PROPERTIES INCLUDE_DIRECTORIES ${root})
  add_subdirectory(${folder})
  set_directory_properties(PROPERTIES INCLUDE_DIRECTORIES "${saved}")
endfunction()

# After all folders are added: every library exposes its folder to the targets that link it, and
# waits for the layer check.
function(carpool_expose_layers)
  foreach(folder ${ARGN})
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${folder}/CMakeLists.txt)
      continue()
    endif()
    carpool_layer_root(root ${folder})
    get_directory_property(targets DIRECTORY ${folder} BUILDSYSTEM_TARGETS)
    foreach(target ${targets})
      get_target_property(type ${target} TYPE)
      if(type MATCHES "^(STATIC|SHARED|OBJECT|MODULE)_LIBRARY$")
        target_include_directories(${target} INTERFACE ${root})
      endif()
      if(NOT type STREQUAL "UTILITY")
        add_dependencies(${target} carpool_check_layers)
      endif()
    endforeach()
  endforeach()
endfunction()

if(CARPOOL_BUILD_TESTS)
  # The checker passes this repository and fails trees with each kind of violation.
  add_test(NAME carpool_layers_test
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_layers_test.py)
endif()
