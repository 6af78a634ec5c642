// kiln/datasets.hpp: kiln's datasets: Fashion-MNIST, byte-level text, and synthetic
// classification, regression and token data.
#pragma once

#include "kiln/kiln.hpp"

#include "kiln/data/fashion_mnist.hpp"
#include "kiln/data/synthetic.hpp"
#include "kiln/data/text.hpp"
