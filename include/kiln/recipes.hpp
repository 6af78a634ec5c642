// kiln/recipes.hpp: TOML recipes: reading and checking them (kiln::read_recipe), running them
// (kiln::run_recipe), and the registry of every kind a recipe may name, kiln's own included.
// Including it instantiates every registered kind (models, datasets, policies), so a file that
// only trains includes kiln/kiln.hpp instead. A header that registers a user's own kinds
// includes kiln/recipe/registry.hpp alone (docs/extending.md).
#pragma once

#include "kiln/kiln.hpp"
#include "kiln/models.hpp"
#include "kiln/datasets.hpp"

#include "kiln/recipe/recipe.hpp"
#include "kiln/recipe/run.hpp"
