"""Walking a local input folder: every regular file once, a folder at a time.

``walk_folder`` gives the files of each folder it lists as one ``FolderFiles``
(names, sizes and modification times as lists, no object per file), in the order
``files.list_stamped`` streams them; the folder layouts build their columns from
these batches (``plan.ref_table``) without a path string or a tuple per file. A
folder is listed with one ``listdir`` and one ``lstat`` per entry (relative to the
folder's descriptor, so the kernel does not walk the path again for each).
"""

from __future__ import annotations

import atexit
import bisect
import errno
import marshal
import os
import signal
import stat
from collections.abc import Callable, Iterator
from typing import NamedTuple

from beam_tfrecords.transforms.codec.image_inspection import IMAGE_EXTENSIONS

__all__ = ["FolderFiles", "take_early_walk", "walk_early", "walk_folder"]

_NOT_A_FILE = "a FIFO, socket or device, not a file; not read"
_FORMAT = 0o170000  # stat.S_IFMT's mask: the kind of file of an st_mode.
_REGULAR = stat.S_IFREG
_OPEN_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


class FolderFiles(NamedTuple):
    """Regular files met in one folder (or, through a link, one file).

    Attributes:
      prefix: the folder's path with a trailing ``/``; a file's path is
        ``prefix + name``.
      names: the files' names, in name order.
      sizes: their sizes in bytes.
      stamps: their modification times in ns.
    """

    prefix: str
    names: list[str]
    sizes: list[int]
    stamps: list[int]


def walk_folder(folder: str, skipped: list | None = None,
                follow_outside: bool = True) -> Iterator[FolderFiles]:
    """The regular files under a local folder, each file once, a folder at a time.

    Every folder and file reached without a symbolic link is listed first (a
    real folder always wins over a link to it, whatever the directory order),
    depth first, a folder's files before its subfolders, each in name order;
    then what links lead to, in path order, each folder or file not met before.
    A link whose target lies outside ``folder`` (resolved) is followed only
    with ``follow_outside``. What is passed over goes to ``skipped`` as
    ``(path, reason, message)``, messages naming other paths relative to
    ``folder``: ``link_loop``, ``duplicate`` (the same file or folder through
    another path), ``link_outside_input``, ``not_a_regular_file`` (FIFOs,
    sockets, devices, also behind a link), ``unreadable`` (a folder or entry
    that cannot be read, a broken link), ``folder_named_like_an_image`` (noted;
    what it holds is listed).
    """
    note = skipped.append if skipped is not None else (lambda item: None)
    walk = _Walk(folder, note)
    try:
        top = os.stat(folder)
        walk.seen_dirs[(top.st_dev, top.st_ino)] = folder
        real_root = os.path.realpath(folder)
    except OSError:
        return
    inside = real_root.rstrip("/") + "/"
    real, links = [folder], []  # Folders reached without a link; links met (to decide last).
    while real:
        listed = _scan(real.pop(), note)
        links += listed.links
        below = []
        for path, key in listed.dirs:
            if key in walk.seen_dirs:  # A bind mount of a folder met before.
                note((path, "duplicate", f"the same folder as {walk.shown(walk.seen_dirs[key])}; "
                      "listed once, there"))
                continue
            walk.seen_dirs[key] = path
            below.append(path)
            _note_image_named_folder(path, note)
        batch = walk.first_time(listed.prefix, listed.names, listed.infos)
        if batch.names:
            yield batch
        real.extend(reversed(below))
    yield from _linked(walk, sorted(links, reverse=True), None if follow_outside else inside)


class _Walk:
    """What a walk has met: folders by ``(device, inode)``, files by ``_file_key``."""

    def __init__(self, folder: str, note: Callable):
        self.folder = folder
        self.note = note
        self.prefix = folder.rstrip("/") + "/"
        self.seen_dirs: dict[tuple[int, int], str] = {}
        # Files met: their key, to where they were met (an index into ``batches``' files).
        self.seen_files: dict[int, int] = {}
        self.batches: list[tuple[int, str, list[str]]] = []  # (first index, prefix, names)
        self.count = 0

    def shown(self, path: str) -> str:
        """A path met before, relative to the walked folder when under it."""
        return path[len(self.prefix):] if path.startswith(self.prefix) else path

    def _path(self, index: int) -> str:
        """The path of the file met ``index``-th."""
        start, prefix, names = self.batches[bisect.bisect_right(self.batches, index, key=lambda b: b[0]) - 1]
        return prefix + names[index - start]

    def first_time(self, prefix: str, names: list[str], infos: list) -> FolderFiles:
        """The files of ``names`` not met before (the others noted ``duplicate``).
        Keys and indices are ints (no object for the garbage collector to follow)."""
        keys = [info.st_dev << 64 | info.st_ino for info in infos]
        seen = self.seen_files
        if len(set(keys)) == len(keys) and seen.keys().isdisjoint(keys):  # The common case.
            seen.update(zip(keys, range(self.count, self.count + len(keys))))
        else:
            kept: list[str] = []
            self.batches.append((self.count, prefix, kept))  # Filled as it goes: a copy may follow.
            rows = []
            for i, key in enumerate(keys):
                if key in seen:
                    self.note((prefix + names[i], "duplicate", f"the same file as "
                               f"{self.shown(self._path(seen[key]))}; converted once, there"))
                    continue
                seen[key] = self.count + len(kept)
                kept.append(names[i])
                rows.append(i)
            self.batches.pop()
            names, infos = kept, [infos[i] for i in rows]
        if names:
            self.batches.append((self.count, prefix, names))
            self.count += len(names)
        return FolderFiles(prefix, names, [info.st_size for info in infos],
                           [info.st_mtime_ns for info in infos])


def _linked(walk: _Walk, pending: list[str], inside: str | None) -> Iterator[FolderFiles]:
    """What the links met lead to: each folder or file once, links in path order
    (so the same tree always lists the same paths)."""
    note, seen_dirs = walk.note, walk.seen_dirs
    while pending:
        path = pending.pop()
        info = _link_target(path, note, inside)
        if info is None:
            continue
        key = (info.st_dev, info.st_ino)
        if not stat.S_ISDIR(info.st_mode):
            cut = path.rfind("/") + 1
            batch = walk.first_time(path[:cut], [path[cut:]], [info])
            if batch.names:
                yield batch
            continue
        if key in seen_dirs:
            first = seen_dirs[key]
            # A link to a folder it sits in would be walked forever.
            reason = "link_loop" if path.startswith(first.rstrip("/") + "/") else "duplicate"
            where = walk.shown(first) if first != walk.folder else "the input folder"
            note((path, reason, f"the same folder as {where}; listed once, there"))
            continue
        seen_dirs[key] = path
        _note_image_named_folder(path, note)
        listed = _scan(path, note)
        batch = walk.first_time(listed.prefix, listed.names, listed.infos)
        if batch.names:
            yield batch
        # Decided when taken: claimed then, or passed over.
        pending.extend(sorted([below for below, _ in listed.dirs] + listed.links, reverse=True))


def _link_target(path: str, note, inside: str | None) -> os.stat_result | None:
    """What a path met through a link is (``os.stat``), when it is a folder or a
    regular file to list (and, with ``inside``, lies under that resolved folder);
    else ``None``, and why is noted."""
    try:
        info = os.stat(path)
    except OSError as err:
        reason = "link_loop" if err.errno == errno.ELOOP else "unreadable"
        note((path, reason, f"cannot follow the path: {err.strerror or err}"))
        return None
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        note((path, "not_a_regular_file", _NOT_A_FILE))
        return None
    if inside is not None and not (os.path.realpath(path) + "/").startswith(inside):
        note((path, "link_outside_input", "a link that leads outside the input folder; not "
              "followed (pass --follow_links_outside to read what it leads to)"))
        return None
    return info


class _Listed(NamedTuple):
    """A folder's entries, none followed: regular files (names and ``lstat``), folders
    ``(path, (dev, inode))`` and links (paths)."""

    prefix: str
    names: list[str]
    infos: list
    dirs: list
    links: list


def _scan(folder: str, note) -> _Listed:
    """A folder's entries, by name, none followed; other entries (FIFOs, sockets,
    devices) noted ``not_a_regular_file``. A folder that cannot be listed is noted
    ``unreadable`` and has none; so is an entry that cannot be read.

    One ``listdir`` and an ``lstat`` of each entry relative to the folder's
    descriptor; when any of that fails, the folder is listed again entry by
    entry (``_scan_entries``), which notes what failed."""
    prefix = folder if folder.endswith("/") else folder + "/"
    try:
        fd = os.open(folder, _OPEN_FOLDER)
    except OSError:
        return _scan_entries(folder, prefix, note)
    try:
        names = sorted(os.listdir(fd))
        infos = [os.stat(name, dir_fd=fd, follow_symlinks=False) for name in names]
    except OSError:
        return _scan_entries(folder, prefix, note)
    finally:
        os.close(fd)
    kinds = [info.st_mode & _FORMAT for info in infos]
    if kinds.count(_REGULAR) == len(kinds):  # The common case: a folder of files.
        return _Listed(prefix, names, infos, [], [])
    listed = _Listed(prefix, [], [], [], [])
    for name, info, kind in zip(names, infos, kinds):
        if kind == _REGULAR:
            listed.names.append(name)
            listed.infos.append(info)
        elif kind == stat.S_IFDIR:
            listed.dirs.append((prefix + name, (info.st_dev, info.st_ino)))
        elif kind == stat.S_IFLNK:
            listed.links.append(prefix + name)
        else:
            note((prefix + name, "not_a_regular_file", _NOT_A_FILE))
    return listed


def _scan_entries(folder: str, prefix: str, note) -> _Listed:
    """``_scan`` with ``os.scandir``, an entry at a time, noting what cannot be read."""
    listed = _Listed(prefix, [], [], [], [])
    try:
        with os.scandir(folder) as found:
            entries = sorted(found, key=lambda entry: entry.name)
    except FileNotFoundError:
        return listed
    except OSError as err:
        note((folder, "unreadable", f"cannot list the folder: {err.strerror or err}"))
        return listed
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):  # The common case: one stat, no link.
                info = entry.stat(follow_symlinks=False)
                listed.names.append(entry.name)
                listed.infos.append(info)
            elif entry.is_dir(follow_symlinks=False):
                info = entry.stat(follow_symlinks=False)
                listed.dirs.append((entry.path, (info.st_dev, info.st_ino)))
            elif entry.is_symlink():
                listed.links.append(entry.path)
            else:
                note((entry.path, "not_a_regular_file", _NOT_A_FILE))
        except OSError as err:
            note((entry.path, "unreadable", f"cannot read the entry: {err.strerror or err}"))
    return listed


def _note_image_named_folder(path: str, note) -> None:
    if os.path.splitext(path)[1].lower() in IMAGE_EXTENSIONS:
        note((path, "folder_named_like_an_image",
              "a folder, not an image file; what it holds is listed as usual"))


# Walks started by ``walk_early``: ``(folder, follow_outside)``: ``(pid, read end)``,
# in the process that started them (``_EARLY_OWNER``).
_EARLY: dict[tuple[str, bool], tuple[int, int]] = {}
_EARLY_OWNER: list[int] = []


def walk_early(folder: str, follow_outside: bool) -> None:
    """Starts ``walk_folder(folder, ..., follow_outside)`` in a forked process, for
    ``take_early_walk`` to take its result later (the launcher's imports run
    meanwhile on the other core; a walk is mostly ``lstat`` calls, which would
    wait on the interpreter's lock in a thread while the imports hold it).

    Called at the very start of the process, before any thread exists. A walk
    not taken is stopped (killed and reaped) when the next walk is taken or the
    process exits, so none outlives the process that started it.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # The child: walks, writes the result, ends without cleanup of the parent's state.
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle.
            os.close(read_end)
            data = marshal.dumps(_walked(folder, follow_outside))
            with open(write_end, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)  # pylint: disable=protected-access
    os.close(write_end)
    if not _EARLY_OWNER:
        _EARLY_OWNER.append(os.getpid())
        atexit.register(_drop_early_walks)
    _EARLY[(folder, follow_outside)] = (pid, read_end)


def _walked(folder: str, follow_outside: bool) -> tuple[list, list, list]:
    """What ``walk_folder`` gives as plain values (``marshal``-able): the batches as
    tuples, the notes, and how many notes had been made when each batch was given."""
    skipped: list = []
    batches, noted = [], []
    for batch in walk_folder(folder, skipped, follow_outside):
        batches.append(tuple(batch))
        noted.append(len(skipped))
    return batches, skipped, noted


def take_early_walk(folder: str, follow_outside: bool,
                    skipped: list | None) -> Iterator[FolderFiles] | None:
    """The result of ``walk_early(folder, follow_outside)`` as ``walk_folder`` would
    give it now (the same batches, with the same notes added to ``skipped`` as they
    are given), or ``None`` when no such walk was started or it failed (the caller
    then walks itself). Any other early walk is stopped and its result dropped.
    """
    early = _EARLY.pop((folder, follow_outside), None)
    _drop_early_walks()
    if early is None:
        return None
    pid, read_end = early
    try:
        with open(read_end, "rb") as stream:
            data = stream.read()
        _, status = os.waitpid(pid, 0)
        if status != 0:
            return None
        batches, notes, noted = marshal.loads(data)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return _replayed(batches, notes, noted, skipped)


def _replayed(batches: list, notes: list, noted: list, skipped: list | None) -> Iterator[FolderFiles]:
    done = 0
    for batch, count in zip(batches, noted):
        if skipped is not None:
            skipped.extend(notes[done:count])
        done = count
        yield FolderFiles(*batch)
    if skipped is not None:
        skipped.extend(notes[done:])


def _drop_early_walks() -> None:
    """Stops the early walks not taken (killed, reaped, their pipes closed)."""
    if _EARLY_OWNER[:1] != [os.getpid()]:  # A forked process's copy: not its walks.
        return
    while _EARLY:
        _, (pid, read_end) = _EARLY.popitem()
        os.close(read_end)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
