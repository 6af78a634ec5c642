// Two optimizers in one pack: the build must stop with a sentence naming the axis.
// expect: kiln: two policies on the optimizer axis
#include <kiln/kiln.hpp>
int main() {
  kiln::trainer<kiln::optim::adamw, kiln::optim::sgd> trainer;
  (void)trainer;
}
