"""One py_test per pytest file, so `bazel test //...` runs the same suite as pytest."""

def pytest_files(name, srcs, data = [], deps = []):
    """Declares a py_test for each file in srcs and a test_suite `name` over them."""
    tests = []
    for src in srcs:
        test_name = src[:-len(".py")].replace("/", "_")
        native.py_test(
            name = test_name,
            srcs = ["//tools/bazel_rules:pytest_main.py", src],
            main = "//tools/bazel_rules:pytest_main.py",
            args = ["$(location %s)" % src],
            data = data,
            deps = deps,
            python_version = "PY3",
            # Multi-process tests start orchestrators and TensorFlow clusters.
            size = "large",
        )
        tests.append(test_name)
    native.test_suite(name = name, tests = tests)
