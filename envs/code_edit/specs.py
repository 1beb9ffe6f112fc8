"""The small pure functions that code_edit's generated repositories are made of (``SPECS``).

Each ``FunctionSpec`` is one function of kind text, math or list with ONE fixed one-line bug
(``bug``: the correct snippet and its buggy replacement; at least one of the cases a ``fix_bug``
task shows exposes it), a fixed rename target (``alt_name``), a front-end label (the wrapper
``show_<label>``), argument lists (``cases``: source text; expected values are computed by running
the reference at generation time) and, for most, a ``ParamSpec`` (a keyword parameter to add, with
its default, the new body and cases that pass it). So a task's reference edit is fixed by its
(family, spec) pair: ``tasks.py`` assigns each pair to one split.

Names, rename targets and labels are unique across ``SPECS`` (checked at import), so any
selection of specs can share a module, a front end and a test file.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class ParamSpec:
    """A parameter to add: ``name=default`` and the body that uses it."""

    name: str
    default: str  # Python source of the default value
    body: str  # new function body (4-space indented)
    cases: tuple[str, ...]  # argument lists (source) that pass the new parameter
    describe: str  # how the body must use it (goes into the instruction)


@dataclass(frozen=True)
class FunctionSpec:
    """One small pure function, with a bug, an alternative name and (optionally) a parameter to add."""

    key: str
    kind: str  # text | math | list
    name: str
    alt_name: str  # the rename target
    label: str  # the front end's wrapper is show_<label>
    params: str
    doc: str
    body: str  # 4-space indented, ends with a newline
    bug: tuple[str, str]  # (correct snippet, buggy snippet) of the body
    cases: tuple[str, ...]  # argument lists (source); the last one is kept for hidden tests
    param: ParamSpec | None = None

    def source(self, name: str | None = None, *, body: str | None = None, params: str | None = None) -> str:
        return (
            f"def {name or self.name}({params or self.params}):\n"
            f'    """{self.doc}"""\n{body if body is not None else self.body}'
        )

    def stub(self) -> str:
        return self.source(body="    raise NotImplementedError\n")

    def buggy(self) -> str:
        good, bad = self.bug
        assert self.body.count(good) == 1, self.key
        return self.source(body=self.body.replace(good, bad))

    def with_param(self) -> str:
        assert self.param is not None
        return self.source(body=self.param.body, params=f"{self.params}, {self.param.name}={self.param.default}")


def _b(text: str) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n") + "\n", "    ")


SPECS: tuple[FunctionSpec, ...] = (
    FunctionSpec(
        key="count_words",
        kind="text",
        name="count_words",
        alt_name="word_count",
        label="words",
        params="text",
        doc="Return the number of whitespace-separated words in `text`.",
        body=_b("return len(text.split())"),
        bug=("text.split()", 'text.split(" ")'),
        cases=("'a b  c'", "''", "'one'", "'  lead and trail '"),
        param=ParamSpec(
            "min_length",
            "1",
            _b("return len([word for word in text.split() if len(word) >= min_length])"),
            ("'a bb ccc', min_length=2", "'a bb ccc', min_length=4"),
            "only words with at least `min_length` characters are counted",
        ),
    ),
    FunctionSpec(
        key="is_palindrome",
        kind="text",
        name="is_palindrome",
        alt_name="reads_same_backwards",
        label="palindrome",
        params="text",
        doc="Return True if `text` reads the same backwards, ignoring case and any character that is "
        "not a letter or digit.",
        body=_b("""
            letters = [c.lower() for c in text if c.isalnum()]
            return letters == letters[::-1]"""),
        bug=("[c.lower() for c", "[c for c"),
        cases=("'Racecar'", "'A man, a plan, a canal: Panama'", "'abc'", "'No lemon, no melon'"),
        param=ParamSpec(
            "ignore_case",
            "True",
            _b("""
            letters = [c.lower() if ignore_case else c for c in text if c.isalnum()]
            return letters == letters[::-1]"""),
            ("'Racecar', ignore_case=False", "'abba', ignore_case=False"),
            "when `ignore_case` is false, upper- and lower-case letters count as different",
        ),
    ),
    FunctionSpec(
        key="title_case",
        kind="text",
        name="title_case",
        alt_name="capitalize_words",
        label="title",
        params="text",
        doc="Return `text` with every word capitalised (first letter upper-case, the rest lower-case), "
        "words separated by single spaces.",
        body=_b('return " ".join(word[:1].upper() + word[1:].lower() for word in text.split())'),
        bug=("word[1:].lower()", "word[1:]"),
        cases=("'hELLO wORLD'", "'hello world'", "''", "'pYTHON'"),
        param=ParamSpec(
            "sep",
            '" "',
            _b("return sep.join(word[:1].upper() + word[1:].lower() for word in text.split())"),
            ("'big red dog', sep='-'", "'x y', sep=''"),
            "the words are joined with `sep`",
        ),
    ),
    FunctionSpec(
        key="truncate",
        kind="text",
        name="truncate",
        alt_name="shorten",
        label="short",
        params="text, limit",
        doc="Return `text` unchanged if it has at most `limit` characters, else its first `limit - 3` "
        "characters followed by '...'.",
        body=_b("""
            if len(text) <= limit:
                return text
            return text[:limit - 3] + "..."
            """),
        bug=("len(text) <= limit", "len(text) < limit"),
        cases=("'abcde', 5", "'abcdefgh', 6", "'hi', 10", "'hello world', 8"),
        param=ParamSpec(
            "ellipsis",
            '"..."',
            _b("""
            if len(text) <= limit:
                return text
            return text[:limit - len(ellipsis)] + ellipsis
            """),
            ("'abcdefgh', 6, ellipsis='~'", "'abcdefgh', 5, ellipsis=''"),
            "`ellipsis` replaces the '...' marker and the result still has at most `limit` characters",
        ),
    ),
    FunctionSpec(
        key="initials",
        kind="text",
        name="initials",
        alt_name="name_initials",
        label="initials",
        params="name",
        doc="Return the upper-case first letters of the words of `name`, e.g. 'ada lovelace' -> 'AL'.",
        body=_b('return "".join(part[0].upper() for part in name.split())'),
        bug=("name.split()", 'name.split(" ")'),
        cases=("'Grace  Brewster Hopper'", "'ada lovelace'", "''", "' alan turing'"),
        param=ParamSpec(
            "sep",
            '""',
            _b("return sep.join(part[0].upper() for part in name.split())"),
            ("'ada lovelace', sep='.'", "'alan mathison turing', sep=' '"),
            "the initials are joined with `sep`",
        ),
    ),
    FunctionSpec(
        key="clamp",
        kind="math",
        name="clamp",
        alt_name="bound",
        label="clamped",
        params="value, low, high",
        doc="Return `value` limited to the range [`low`, `high`].",
        body=_b("return max(low, min(value, high))"),
        bug=("max(low, min(value, high))", "min(low, max(value, high))"),
        cases=("5, 0, 10", "-3, 0, 10", "42, 0, 10", "0.5, 0, 1"),
    ),
    FunctionSpec(
        key="mean",
        kind="math",
        name="mean",
        alt_name="average",
        label="mean",
        params="values",
        doc="Return the arithmetic mean of `values`, or 0.0 for an empty list.",
        body=_b("""
            if not values:
                return 0.0
            return sum(values) / len(values)
            """),
        bug=("sum(values) / len", "sum(values) // len"),
        cases=("[1, 2]", "[2, 4, 6]", "[]", "[1.5, 2.5, 4]"),
        param=ParamSpec(
            "default",
            "0.0",
            _b("""
            if not values:
                return default
            return sum(values) / len(values)
            """),
            ("[], default=None", "[], default=-1"),
            "`default` is returned for an empty list",
        ),
    ),
    FunctionSpec(
        key="percent",
        kind="math",
        name="percent",
        alt_name="percentage",
        label="percent",
        params="part, whole",
        doc="Return `part` as a percentage of `whole`, rounded to 1 decimal place; 0.0 when `whole` is 0.",
        body=_b("""
            if whole == 0:
                return 0.0
            return round(100 * part / whole, 1)
            """),
        bug=("round(100 * part / whole, 1)", "round(part / whole, 1)"),
        cases=("1, 4", "1, 3", "0, 0", "5, 8"),
        param=ParamSpec(
            "ndigits",
            "1",
            _b("""
            if whole == 0:
                return 0.0
            return round(100 * part / whole, ndigits)
            """),
            ("1, 3, ndigits=2", "2, 3, ndigits=0"),
            "the result is rounded to `ndigits` decimal places",
        ),
    ),
    FunctionSpec(
        key="median",
        kind="math",
        name="median",
        alt_name="middle_value",
        label="median",
        params="values",
        doc="Return the median of a non-empty list of numbers (the mean of the two middle values for an even count).",
        body=_b("""
            ordered = sorted(values)
            mid = len(ordered) // 2
            if len(ordered) % 2:
                return ordered[mid]
            return (ordered[mid - 1] + ordered[mid]) / 2
            """),
        bug=("ordered = sorted(values)", "ordered = list(values)"),
        cases=("[3, 1, 2]", "[4, 1, 3, 2]", "[5]", "[9, 7, 8]"),
    ),
    FunctionSpec(
        key="scale",
        kind="math",
        name="scale",
        alt_name="rescale",
        label="scaled",
        params="values, factor",
        doc="Return a new list with every value of `values` multiplied by `factor`.",
        body=_b("return [value * factor for value in values]"),
        bug=("value * factor", "value + factor"),
        cases=("[1, 2, 3], 3", "[], 5", "[0.5], 4", "[-1, 10], 0"),
        param=ParamSpec(
            "offset",
            "0",
            _b("return [value * factor + offset for value in values]"),
            ("[1, 2], 3, offset=1", "[0], 2, offset=-1"),
            "`offset` is added to every scaled value",
        ),
    ),
    FunctionSpec(
        key="chunk",
        kind="list",
        name="chunk",
        alt_name="split_into_chunks",
        label="chunks",
        params="items, size",
        doc="Split `items` into consecutive lists of `size` items; the last one may be shorter.",
        body=_b("return [items[i:i + size] for i in range(0, len(items), size)]"),
        bug=("range(0, len(items), size)", "range(0, len(items) - size, size)"),
        cases=("[1, 2, 3, 4, 5], 2", "[], 3", "[1, 2], 5", "['a', 'b', 'c', 'd'], 2"),
    ),
    FunctionSpec(
        key="dedupe",
        kind="list",
        name="dedupe",
        alt_name="unique_items",
        label="unique",
        params="items",
        doc="Return the items of `items` without duplicates, keeping the first occurrence of each, in order.",
        body=_b("""
            seen = set()
            result = []
            for item in items:
                if item not in seen:
                    seen.add(item)
                    result.append(item)
            return result
            """),
        bug=("            seen.add(item)\n", ""),
        cases=("[3, 1, 3, 2, 1]", "[]", "['a', 'b', 'a']", "[1, 1, 1]"),
        param=ParamSpec(
            "key",
            "None",
            _b("""
            seen = set()
            result = []
            for item in items:
                marker = item if key is None else key(item)
                if marker not in seen:
                    seen.add(marker)
                    result.append(item)
            return result
            """),
            ("['a', 'A', 'b'], key=str.lower", "[1, -1, 2], key=abs"),
            "when `key` is given, two items are duplicates if `key(item)` is equal",
        ),
    ),
    FunctionSpec(
        key="running_total",
        kind="list",
        name="running_total",
        alt_name="cumulative_sum",
        label="totals",
        params="values",
        doc="Return the running totals of `values`: element i is the sum of values[0] to values[i].",
        body=_b("""
            totals = []
            total = 0
            for value in values:
                total += value
                totals.append(total)
            return totals
            """),
        bug=("totals.append(total)", "totals.append(value)"),
        cases=("[1, 2, 3]", "[]", "[5, -2]", "[0, 4, 4]"),
        param=ParamSpec(
            "start",
            "0",
            _b("""
            totals = []
            total = start
            for value in values:
                total += value
                totals.append(total)
            return totals
            """),
            ("[1, 2], start=10", "[3], start=-3"),
            "the running total starts at `start`",
        ),
    ),
    FunctionSpec(
        key="flatten",
        kind="list",
        name="flatten",
        alt_name="flatten_lists",
        label="flat",
        params="nested",
        doc="Return one list holding the items of every list in `nested`, in order.",
        body=_b("return [item for group in nested for item in group]"),
        bug=("in nested for", "in nested[1:] for"),
        cases=("[[1, 2], [3], []]", "[]", "[['a'], ['b', 'c']]", "[[0], [0, 1]]"),
    ),
    FunctionSpec(
        key="top_n",
        kind="list",
        name="top_n",
        alt_name="largest",
        label="top",
        params="items, n",
        doc="Return the `n` largest items of `items`, largest first.",
        body=_b("return sorted(items, reverse=True)[:n]"),
        bug=("sorted(items, reverse=True)", "sorted(items)"),
        cases=("[3, 1, 2], 2", "[5], 3", "[], 1", "[1, 9, 4, 7], 1"),
        param=ParamSpec(
            "key",
            "None",
            _b("return sorted(items, key=key, reverse=True)[:n]"),
            ("['bb', 'a', 'ccc'], 2, key=len", "[-5, 2, -1], 1, key=abs"),
            "`key` is passed to `sorted` as the sort key",
        ),
    ),
    # ----- text -----
    FunctionSpec(
        key="count_vowels",
        kind="text",
        name="count_vowels",
        alt_name="vowel_count",
        label="vowels",
        params="text",
        doc="Return the number of vowels (a, e, i, o, u, in either case) in `text`.",
        body=_b('return sum(1 for c in text.lower() if c in "aeiou")'),
        bug=("text.lower()", "text"),
        cases=("'Hello World'", "'xyz'", "'AEIOU'", "'Programming'"),
        param=ParamSpec(
            "vowels",
            '"aeiou"',
            _b("return sum(1 for c in text.lower() if c in vowels)"),
            ("'rhythm', vowels='aeiouy'", "'Banana', vowels='a'"),
            "only the characters in `vowels` count as vowels (`text` is compared in lower case)",
        ),
    ),
    FunctionSpec(
        key="slugify",
        kind="text",
        name="slugify",
        alt_name="make_slug",
        label="slug",
        params="text",
        doc="Return `text` in lower case with its words joined by hyphens, e.g. 'Hello World' -> 'hello-world'.",
        body=_b('return "-".join(text.lower().split())'),
        bug=("text.lower().split()", "text.split()"),
        cases=("'Hello World'", "'  many   spaces here '", "''", "'Already-Slugged Text'"),
        param=ParamSpec(
            "sep",
            '"-"',
            _b("return sep.join(text.lower().split())"),
            ("'Hello World', sep='_'", "'a b c', sep=''"),
            "the words are joined with `sep`",
        ),
    ),
    FunctionSpec(
        key="reverse_words",
        kind="text",
        name="reverse_words",
        alt_name="words_backwards",
        label="reversed",
        params="text",
        doc="Return the words of `text` in reverse order, separated by single spaces.",
        body=_b('return " ".join(text.split()[::-1])'),
        bug=("[::-1]", "[:-1]"),
        cases=("'one two three'", "'hello'", "''", "'  a  b '"),
    ),
    FunctionSpec(
        key="mask",
        kind="text",
        name="mask",
        alt_name="obscure",
        label="masked",
        params="text, keep",
        doc="Return `text` with every character except the last `keep` ones replaced by '*'.",
        body=_b("""
            hidden = max(len(text) - keep, 0)
            return "*" * hidden + text[hidden:]
            """),
        bug=("max(len(text) - keep, 0)", "max(len(text) - keep - 1, 0)"),
        cases=("'4111222233334444', 4", "'abc', 5", "'hello', 0", "'password', 2"),
        param=ParamSpec(
            "char",
            '"*"',
            _b("""
            hidden = max(len(text) - keep, 0)
            return char * hidden + text[hidden:]
            """),
            ("'secret', 2, char='#'", "'abc', 1, char=''"),
            "`char` replaces '*' as the masking character",
        ),
    ),
    # ----- math -----
    FunctionSpec(
        key="gcd",
        kind="math",
        name="gcd",
        alt_name="greatest_common_divisor",
        label="gcd",
        params="a, b",
        doc="Return the greatest common divisor of the integers `a` and `b` (never negative).",
        body=_b("""
            while b:
                a, b = b, a % b
            return abs(a)
            """),
        bug=("a % b", "a // b"),
        cases=("12, 8", "17, 5", "0, 9", "-4, 6"),
    ),
    FunctionSpec(
        key="variance",
        kind="math",
        name="variance",
        alt_name="population_variance",
        label="variance",
        params="values",
        doc="Return the population variance of `values` (the mean squared distance from their mean), "
        "or 0.0 for an empty list.",
        body=_b("""
            if not values:
                return 0.0
            mu = sum(values) / len(values)
            return sum((v - mu) ** 2 for v in values) / len(values)
            """),
        bug=("(v - mu) ** 2", "(v - mu)"),
        cases=("[1, 3]", "[2, 4, 4, 4, 5, 5, 7, 9]", "[]", "[1, 2, 3, 4]"),
        param=ParamSpec(
            "ddof",
            "0",
            _b("""
            if not values:
                return 0.0
            mu = sum(values) / len(values)
            return sum((v - mu) ** 2 for v in values) / (len(values) - ddof)
            """),
            ("[1, 3], ddof=1", "[2, 4, 4, 4, 5, 5, 7, 9], ddof=1"),
            "the sum of squared distances is divided by `len(values) - ddof`",
        ),
    ),
    FunctionSpec(
        key="safe_divide",
        kind="math",
        name="safe_divide",
        alt_name="divide_or_zero",
        label="ratio",
        params="a, b",
        doc="Return `a / b`, or 0.0 when `b` is 0.",
        body=_b("""
            if b == 0:
                return 0.0
            return a / b
            """),
        bug=("if b == 0:", "if a == 0:"),
        cases=("7, 2", "1, 0", "0, 5", "-9, 4"),
        param=ParamSpec(
            "default",
            "0.0",
            _b("""
            if b == 0:
                return default
            return a / b
            """),
            ("1, 0, default=None", "5, 0, default=-1"),
            "`default` is returned when `b` is 0",
        ),
    ),
    FunctionSpec(
        key="digit_sum",
        kind="math",
        name="digit_sum",
        alt_name="sum_of_digits",
        label="digits",
        params="n",
        doc="Return the sum of the decimal digits of the integer `n` (its sign is ignored).",
        body=_b("return sum(int(d) for d in str(abs(n)))"),
        bug=("str(abs(n))", "str(n)"),
        cases=("1234", "0", "-56", "909"),
        param=ParamSpec(
            "base",
            "10",
            _b("""
            n = abs(n)
            total = 0
            while n:
                total += n % base
                n //= base
            return total
            """),
            ("255, base=16", "5, base=2"),
            "the digits are those of `n` written in base `base`",
        ),
    ),
    # ----- list -----
    FunctionSpec(
        key="rotate",
        kind="list",
        name="rotate",
        alt_name="rotate_left",
        label="rotated",
        params="items, k",
        doc="Return `items` rotated left by `k` positions (`k` may exceed the length); an empty list stays empty.",
        body=_b("""
            if not items:
                return []
            k %= len(items)
            return items[k:] + items[:k]
            """),
        bug=("items[k:] + items[:k]", "items[:k] + items[k:]"),
        cases=("[1, 2, 3, 4], 1", "[1, 2, 3], 4", "[], 2", "['a', 'b', 'c'], 2"),
        param=ParamSpec(
            "right",
            "False",
            _b("""
            if not items:
                return []
            if right:
                k = -k
            k %= len(items)
            return items[k:] + items[:k]
            """),
            ("[1, 2, 3, 4], 1, right=True", "['a', 'b', 'c'], 5, right=True"),
            "when `right` is true the items rotate right instead of left",
        ),
    ),
    FunctionSpec(
        key="differences",
        kind="list",
        name="differences",
        alt_name="consecutive_differences",
        label="diffs",
        params="values",
        doc="Return the differences of consecutive values: element i is values[i + 1] - values[i].",
        body=_b("return [b - a for a, b in zip(values, values[1:])]"),
        bug=("b - a", "a - b"),
        cases=("[1, 4, 9]", "[5]", "[]", "[3, 3, 0]"),
        param=ParamSpec(
            "step",
            "1",
            _b("return [b - a for a, b in zip(values, values[step:])]"),
            ("[1, 2, 4, 8], step=2", "[0, 5], step=3"),
            "element i becomes `values[i + step] - values[i]`",
        ),
    ),
    FunctionSpec(
        key="frequencies",
        kind="list",
        name="frequencies",
        alt_name="count_occurrences",
        label="counts",
        params="items",
        doc="Return a dict mapping each item of `items` to the number of times it occurs.",
        body=_b("""
            counts = {}
            for item in items:
                counts[item] = counts.get(item, 0) + 1
            return counts
            """),
        bug=("counts.get(item, 0) + 1", "counts.get(item, 1)"),
        cases=("['a', 'b', 'a']", "[]", "[1, 1, 1, 2]", "['x']"),
        param=ParamSpec(
            "min_count",
            "1",
            _b("""
            counts = {}
            for item in items:
                counts[item] = counts.get(item, 0) + 1
            return {item: n for item, n in counts.items() if n >= min_count}
            """),
            ("['a', 'b', 'a'], min_count=2", "[1, 2, 3], min_count=5"),
            "only the items that occur at least `min_count` times are kept",
        ),
    ),
    FunctionSpec(
        key="last_index",
        kind="list",
        name="last_index",
        alt_name="find_last",
        label="last",
        params="items, target",
        doc="Return the index of the last occurrence of `target` in `items`, or -1 if it does not occur.",
        body=_b("""
            for i in range(len(items) - 1, -1, -1):
                if items[i] == target:
                    return i
            return -1
            """),
        bug=("range(len(items) - 1, -1, -1)", "range(len(items) - 1, 0, -1)"),
        cases=("[1, 2, 1], 1", "['a', 'b'], 'a'", "[], 3", "[5, 5], 5"),
        param=ParamSpec(
            "default",
            "-1",
            _b("""
            for i in range(len(items) - 1, -1, -1):
                if items[i] == target:
                    return i
            return default
            """),
            ("[1, 2], 3, default=None", "[], 0, default=99"),
            "`default` is returned when `target` does not occur",
        ),
    ),
)
SPEC_BY_KEY = {s.key: s for s in SPECS}


def _check_unique() -> None:
    keys = [s.key for s in SPECS]
    names = [s.name for s in SPECS] + [s.alt_name for s in SPECS]
    labels = [s.label for s in SPECS]
    for what, values in (("key", keys), ("name or alt_name", names), ("label", labels)):
        dup = sorted({v for v in values if values.count(v) > 1})
        assert not dup, f"code_edit specs: duplicate {what} {dup}"


_check_unique()
