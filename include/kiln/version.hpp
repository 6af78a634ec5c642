// kiln/version.hpp: kiln's own version, for `kiln doctor` and find_package(kiln VERSION).
#pragma once

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"
