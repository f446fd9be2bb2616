from solution import add

assert add(2, 3) == 5
assert add(-1, 1) == 0
assert add(10**12, 1) == 10**12 + 1
