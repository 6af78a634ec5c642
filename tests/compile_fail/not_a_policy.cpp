// A type that names no axis is not a policy.
// expect: kiln: this type is not a policy: it has no member `using axis
#include <kiln/kiln.hpp>
struct my_optimizer {};
int main() {
  kiln::trainer<my_optimizer> trainer;
  (void)trainer;
}
