"""Canvas roster: each submission folder matched to its gradebook row by SIS User ID, SIS Login ID or Canvas ID."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dsgd_teach.grading import canvas, cli, export
from dsgd_teach.grading.verdict import Grade

# A gradebook export as Canvas writes it: a byte-order mark, an Integration ID column, an assignment column with
# its Canvas id, read-only score columns, the Points Possible row and the posting-policy row, a test student.
ROSTER = (
    "\ufeffStudent,ID,SIS User ID,SIS Login ID,Integration ID,Section,ps01_sgd (4711),Quiz 1 (4712),"
    "Current Score,Final Score\r\n"
    "    Points Possible,,,,,,6.00,10.00,(read only),(read only)\r\n"
    ",,,,,,Manual Posting,,,\r\n"
    '"Lovelace, Ada",101,s1001,ada@uni.example,,Section A,,8.00,80.00,80.00\r\n'
    '"Babbage, Charles",102,s1002,cbabbage,,Section A,,,,\r\n'
    '"Hopper, Grace",103,s1003,ghopper,,Section B,,,,\r\n'
    '"Dee, John",104,s1004,jdee,,Section B,,,,\r\n'
    '"Turing, Alan",105,s1005,alan,,Section B,,,,\r\n'
    '"Alan, Other",106,alan,oalan,,Section B,,,,\r\n'
    '"Student, Test",107,,,,,,,,\r\n'
)
# folder -> why it should match (or not)
FOLDERS = {"s1001": ("Lovelace, Ada", "SIS User ID"), "CBabbage": ("Babbage, Charles", "SIS Login ID, any case"),
           "103": ("Hopper, Grace", "Canvas ID"), "ghost": (None, "names nobody"),
           "alan": (None, "SIS Login ID of one student and SIS User ID of another")}


@dataclass
class Sub:
    student: str
    assignment: str
    grades: list[Grade] = field(default_factory=list)


def _subs() -> list[Sub]:
    points = {"s1001": 6.0, "CBabbage": 4.0, "103": 0.0, "ghost": 2.0, "alan": 6.0}
    return [Sub(f, "ps01_sgd", [Grade("q1", points[f] / 2, 3.0, ""), Grade("q2", points[f] / 2, 3.0, "")])
            for f in FOLDERS]


@pytest.fixture
def roster_file(tmp_path) -> Path:
    path = tmp_path / "gradebook.csv"
    path.write_bytes(ROSTER.encode("utf-8"))
    return path


def test_roster_reads_students_and_assignment_columns(roster_file):
    roster = canvas.read_roster(roster_file)
    assert [s.canvas_id for s in roster.students] == ["101", "102", "103", "104", "105", "106", "107"]
    assert roster.columns == {"ps01_sgd": "ps01_sgd (4711)", "Quiz 1": "Quiz 1 (4712)"}


def test_each_folder_matches_by_each_id_kind_and_the_unmatched_are_reported(roster_file):
    roster = canvas.read_roster(roster_file)
    m = canvas.match(list(FOLDERS), roster)
    assert {f: s.name for f, s in m.found.items()} == {f: name for f, (name, _) in FOLDERS.items() if name}
    assert set(m.folders_without_student) == {"ghost", "alan"}
    assert "no roster row" in m.folders_without_student["ghost"]
    assert "names 2 students" in m.folders_without_student["alan"]
    assert [s.name for s in m.students_without_folder] == ["Dee, John", "Turing, Alan", "Alan, Other",
                                                           "Student, Test"]


def test_canvas_import_csv_carries_the_roster_identity_and_column(roster_file):
    roster = canvas.read_roster(roster_file)
    rows = list(csv.reader(io.StringIO(export.canvas_csv(_subs(), roster))))
    assert rows[0] == export.CANVAS_IDENTITY + ["ps01_sgd (4711)"]
    assert rows[1] == [export.CANVAS_POINTS_ROW, "", "", "", "", "6"]
    assert rows[2:] == [["Babbage, Charles", "102", "s1002", "cbabbage", "Section A", "4"],
                        ["Hopper, Grace", "103", "s1003", "ghopper", "Section B", "0"],
                        ["Lovelace, Ada", "101", "s1001", "ada@uni.example", "Section A", "6"]]
    unmatched = list(csv.DictReader(io.StringIO(export.canvas_unmatched_csv(_subs(), roster))))
    assert [(r["kind"], r["folder"] or r["ID"]) for r in unmatched] == [
        ("folder", "alan"), ("folder", "ghost"), ("student", "104"), ("student", "105"), ("student", "106"),
        ("student", "107")]


def test_export_writes_both_files(roster_file, tmp_path):
    out = tmp_path / "out"
    written = export.export(out, _subs(), ["canvas"], roster=canvas.read_roster(roster_file))
    assert written == [export.CANVAS_FILE, export.CANVAS_UNMATCHED]
    assert "ps01_sgd (4711)" in (out / export.CANVAS_FILE).read_text()


@pytest.mark.parametrize("text, why", [
    ("Name,ID\r\nx,1\r\n", "not a Canvas gradebook export"),
    ("", "is empty"),
])
def test_a_file_that_is_not_a_gradebook_export_is_refused(tmp_path, text, why):
    path = tmp_path / "x.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=why):
        canvas.read_roster(path)
    path.write_bytes(b"\xff\xfe" + ROSTER.encode("utf-16-le"))
    with pytest.raises(ValueError, match="not UTF-8"):
        canvas.read_roster(path)


def test_cli_refuses_a_roster_without_the_canvas_export(roster_file, tmp_path, capsys):
    (tmp_path / "subs").mkdir()
    assert cli.main([str(tmp_path / "subs"), "--roster", str(roster_file), "--out", str(tmp_path / "o")]) == 2
    assert "--roster needs --export canvas" in capsys.readouterr().err
