"""Skeleton texts the grammar must accept and refuse, for the skeleton tests (the constraint
against the tiny and the real tokenizer). ``benchmarks/constraint_compare.py`` began from the
same cases and keeps its own frozen copy beside its published result; these may grow."""

VALID_SKELETONS = (
    "[DIRECT]",
    "[PLAN]\n1. Gather the materials\n2. Cut the wood to size\n[END]",
    "[PLAN]\n1. Define the goal and the audience\n2. Research competitors\n"
    "3. Pick channels: email, social media, ads\n4. Set a budget\n"
    "5. Measure results (weekly)\n6. Adjust the plan\n[END]",
    "[PLAN]\n1. Café opening hours – check them\n2. Préparer le menu\n3. 准备材料\n[END]",
    "[PLAN]\n1. " + "x" * 80 + "\n2. A\n[END]",
)
INVALID_SKELETONS = (
    "[PLAN]\n1. Only one point\n[END]",
    "[PLAN]\n1. First\n3. Third\n[END]",
    "[PLAN]\n" + "".join(f"{i}. Point\n" for i in range(1, 8)) + "[END]",
    "[PLAN]\n1. Has [bracket]\n2. Second\n[END]",
    "[PLAN]\n1. " + "x" * 81 + "\n2. A\n[END]",
    "[PLAN]\n1. \n2. Empty title\n[END]",
    "[PLAN]\n1.  Leading space\n2. Second\n[END]",
    "[PLAN]\n1. Trailing space \n2. Second\n[END]",
    "[PLAN]\n1. Tab\there\n2. Second\n[END]",
    "[PLAN]\n1. First\n2. Second\n[END]\n",
    "[direct]",
    "[DIRECT] and more",
    "Sure! [DIRECT]",
)
