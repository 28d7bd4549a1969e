// SIMDATTN_API marks what the shared library exports: the public C++ API (classes, with their
// type information, and functions). Everything else is built with hidden visibility.
#pragma once

#define SIMDATTN_API __attribute__((visibility("default")))
