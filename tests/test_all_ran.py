"""tests/all_ran.py: under pytest-xdist, as `make test` runs, every collected test runs once, and a
run in which one never reports fails. Each case runs pytest -n 2 on a small suite of its own."""

import subprocess
import sys
import textwrap

CASES = textwrap.dedent('''
    import pytest

    pytest_plugins = ["tests.all_ran"]


    class Case(pytest.Item):
        def runtest(self):
            (self.path.parent / f"ran-{self.name}").write_text("")


    class Cases(pytest.File):
        def collect(self):
            for name in self.path.read_text().split():
                # every case under one node id, as Schemathesis gives its API operations' tests
                yield Case.from_parent(self, name=name, nodeid=f"{self.nodeid}::case")


    def pytest_collect_file(file_path, parent):
        if file_path.name == "cases.txt":
            return Cases.from_parent(parent, path=file_path)
''')

GHOST = textwrap.dedent('''
    import pytest

    pytest_plugins = ["tests.all_ran"]


    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(session):
        import tests.all_ran

        if tests.all_ran._collected:  # the controller: one more collected test that never reports
            tests.all_ran._collected["test_one.py::test_ghost"] += 1
''')


def run_xdist(folder, repo_root, *args):
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=folder, env={"PYTHONPATH": str(repo_root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_tests_that_share_a_node_id_each_run(tmp_path, repo_root):
    (tmp_path / "conftest.py").write_text(CASES)
    (tmp_path / "cases.txt").write_text("get_jobs post_jobs get_workers")

    done = run_xdist(tmp_path, repo_root, "cases.txt")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-get_jobs", "ran-get_workers", "ran-post_jobs"]


def test_a_collected_test_that_never_reports_fails_the_run_naming_it(tmp_path, repo_root):
    (tmp_path / "conftest.py").write_text(GHOST)
    (tmp_path / "test_one.py").write_text("def test_real():\n    pass\n")

    done = run_xdist(tmp_path, repo_root)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "1 collected tests never ran" in done.stdout and "test_one.py::test_ghost" in done.stdout


def test_tests_whose_ids_stay_the_same_fail_the_run_naming_them(tmp_path, repo_root):
    # Two cases of one name in one file: even their own names cannot tell them apart.
    (tmp_path / "conftest.py").write_text(CASES)
    (tmp_path / "cases.txt").write_text("same same")

    done = run_xdist(tmp_path, repo_root, "cases.txt")

    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 collected tests share a node id" in done.stdout and "cases.txt::same" in done.stdout
