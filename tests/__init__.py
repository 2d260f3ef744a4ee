"""graphamp's tests: one folder per package (tests/<package>/), each a package of its own so that
test files of one name in two folders do not collide; the fixtures they share in conftest.py,
the helpers in the modules beside it."""
