// Launchers compiled in their own units (a family's instances/), each unit registering the ones it
// compiles when the extension loads: a binding finds a launcher by its key, and a combination is
// named once, where it is compiled. Torch-free.
#pragma once

#include <vector>

namespace transformer_kernels {

// Variant: a struct with a `key` (comparable with ==) and its launchers.
template <typename Variant>
class VariantRegistry {
 public:
  static void add(const Variant& variant) { all().push_back(variant); }

  // The variant registered for `key`, or null where none is compiled.
  template <typename Key>
  static const Variant* find(const Key& key) {
    for (const Variant& variant : all())
      if (variant.key == key) return &variant;
    return nullptr;
  }

 private:
  // Constructed on first use: the units' registrations run before any lookup, in any order.
  static std::vector<Variant>& all() {
    static std::vector<Variant> variants;
    return variants;
  }
};

// A unit's registration of one variant: a namespace-scope constant of this type.
template <typename Variant>
struct RegisterVariant {
  explicit RegisterVariant(const Variant& variant) { VariantRegistry<Variant>::add(variant); }
};

}  // namespace transformer_kernels
