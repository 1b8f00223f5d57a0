#!/usr/bin/env python3
"""Lists the longest functions in C++ sources (signature line to closing brace).

A heuristic, not a parser: strips comments and string/char literals, tracks brace
depth, and treats a `{` that follows `)` (optionally with const/noexcept/override/
-> type/member initialisers) outside any function body as a function body. Lambdas
and local classes count toward the function that encloses them.
Usage: tools/longest_functions.py [-n 10] [--over N] [dirs or files...]   (default: src)
  --over N   print every function longer than N lines (instead of the n longest) and exit 1 if there is one that
             tools/size_exceptions.txt does not name (its lines: `function NAME  reason`)
"""
import os
import re
import sys


def strip(text):
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append('\n' * text.count('\n', i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(')' + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + '\n' * text.count('\n', i, j))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


SCOPE = re.compile(r'\b(namespace|class|struct|union|enum)\b[^;{()]*$|extern\s+""\s*$')


def functions(path):
    src = strip(open(path, encoding='utf-8', errors='replace').read())
    results, stack = [], []  # stack entries: ('scope'|'func'|'other', start_offset)
    last_stmt_end = 0
    for i, c in enumerate(src):
        in_expr = any(k == 'expr' for k, _, _ in stack)
        if c in ';}':
            if c == '}' and stack:
                kind, start, head = stack.pop()
                if kind == 'func':
                    results.append((head, start, i))
                if kind == 'expr' or in_expr:
                    continue  # a brace-init or lambda inside a declaration: the declaration goes on
            if not in_expr:
                last_stmt_end = i + 1
        elif c == '{':
            head = src[last_stmt_end:i]
            in_func = any(k in ('func', 'other') for k, _, _ in stack)
            if in_expr or (not in_func and (head.count('(') > head.count(')') or head.rstrip().endswith(','))):
                # a brace inside parentheses (a member initialiser `group_({...})`, a lambda argument)
                stack.append(('expr', i, ''))
                continue
            if in_func:
                stack.append(('other', i, ''))
            elif SCOPE.search(head.strip()) or head.strip().endswith('=') or not head.strip():
                stack.append(('scope', i, ''))
            elif re.search(r'\)[\w\s:&*<>,\->]*$', head.strip()) or re.search(r'\)\s*:.*$', head.strip(), re.S):
                stack.append(('func', last_stmt_end, head))
            else:
                stack.append(('other', i, ''))
            last_stmt_end = i + 1
    out = []
    for head, start, end in results:
        # first non-blank line of the head is the signature
        sig_off = start + len(head) - len(head.lstrip())
        first = src.count('\n', 0, sig_off) + 1
        last = src.count('\n', 0, end) + 1
        sig = ' '.join(head.split())
        m = re.search(r'([\w:~<>]+)\s*\(', sig)
        name = m.group(1) if m else sig[:40]
        out.append((last - first + 1, name, path, first))
    return out


def exceptions(kind):
    """Names listed as `KIND NAME  reason` in tools/size_exceptions.txt (blank lines and # comments skipped)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'size_exceptions.txt')
    names = set()
    if os.path.exists(path):
        for line in open(path, encoding='utf-8'):
            parts = line.split()
            if len(parts) >= 2 and parts[0] == kind:
                names.add(parts[1])
    return names


def main(argv):
    n, over, paths = 10, None, []
    it = iter(argv)
    for a in it:
        if a == '-n':
            n = int(next(it))
        elif a == '--over':
            over = int(next(it))
        else:
            paths.append(a)
    paths = paths or ['src']
    files = []
    for p in paths:
        if os.path.isfile(p):
            files.append(p)
        for root, _, names in os.walk(p):
            files += [os.path.join(root, f) for f in names if f.endswith(('.cc', '.cpp', '.h'))]
    allf = [f for path in sorted(files) for f in functions(path)]
    if over is None:
        for lines, name, path, first in sorted(allf, reverse=True)[:n]:
            print(f'{lines:5d}  {name}  {path}:{first}')
        return 0
    allowed, bad = exceptions('function'), 0
    for lines, name, path, first in sorted(allf, reverse=True):
        if lines <= over:
            break
        kept = name in allowed
        bad += 0 if kept else 1
        print(f'{lines:5d}  {name}  {path}:{first}' + ('  (an exception: tools/size_exceptions.txt)' if kept else
                                                         f'  OVER {over}'))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
