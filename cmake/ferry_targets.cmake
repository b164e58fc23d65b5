# ferry_library(<name> SOURCES ... [PUBLIC deps...] [PRIVATE deps...] [NO_INSTALL])
# One folder, one target: makes the static library ferry_<name> (alias ferry::<name>) with ferry's
# include tree, warnings and sanitizers, and adds it to the installed set unless NO_INSTALL.
function(ferry_library name)
  cmake_parse_arguments(arg "NO_INSTALL" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  add_library(ferry_${name} STATIC ${arg_SOURCES})
  add_library(ferry::${name} ALIAS ferry_${name})
  set_target_properties(ferry_${name} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(ferry_${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(ferry_${name} PUBLIC ${arg_PUBLIC}
    PRIVATE ${arg_PRIVATE} $<BUILD_INTERFACE:${FERRY_FMT}>
            $<BUILD_INTERFACE:nlohmann_json::nlohmann_json> $<BUILD_INTERFACE:ferry_warnings>)
  if(NOT arg_NO_INSTALL)
    set_property(GLOBAL APPEND PROPERTY FERRY_INSTALLED_TARGETS ferry_${name})
  endif()
endfunction()
