"""Repository rule: the rules_java that comes with the Bazel on PATH, offline.

Bazel 4 needs a rules_java repository and would otherwise download one. A
distribution's Bazel ships it beside itself: Debian's bazel-rules-java puts it
in <prefix>/share/bazel/rules/java for the bazel in <prefix>/bin. The rule
finds it there (or at $RULES_JAVA_PATH), so the WORKSPACE names no path.
"""

def _local_rules_java_impl(ctx):
    candidates = []
    if ctx.os.environ.get("RULES_JAVA_PATH"):
        candidates.append(ctx.path(ctx.os.environ["RULES_JAVA_PATH"]))
    for tool in ("bazel", "bazel-4"):
        found = ctx.which(tool)
        if found:
            candidates.append(found.dirname.dirname.get_child("share").get_child("bazel").get_child("rules").get_child("java"))
    for candidate in candidates:
        if candidate.get_child("WORKSPACE").exists:
            for child in candidate.readdir():
                ctx.symlink(child, child.basename)
            return
    fail("No local rules_java (looked in %s): install Debian's bazel-rules-java, or set " % [str(c) for c in candidates] +
         "--repo_env=RULES_JAVA_PATH=/path/to/rules_java.")

local_rules_java = repository_rule(
    implementation = _local_rules_java_impl,
    environ = ["RULES_JAVA_PATH"],
    local = True,
)
