"""Issue 24: a client and a server of different versions meet with an error naming both package
versions (and protocol versions) and what to do, in both directions: an old client (a fake peer
speaking protocol 5, the last one whose hello had no version) against this build's server, and
this build's client against a fake old server that rejects its hello as a protocol-5 server did."""

import pathlib
import re
import socket
import struct
import tempfile
import threading
import unittest

import carpool

MAGIC = 0x4C505243
HELLO, ERROR = 1, 10
FAILED_PRECONDITION = 6
FIX = "install the same carpool version on both sides"


def frame(version, type_, payload):
    return struct.pack("<IHHI", MAGIC, version, type_, len(payload)) + payload


def string(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def read_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AssertionError(f"peer closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_frame(sock):
    magic, version, type_, length = struct.unpack("<IHHI", read_exactly(sock, 12))
    assert magic == MAGIC, hex(magic)
    return version, type_, read_exactly(sock, length)


def server_side(message):
    """(package version, protocol) the message gives for the server."""
    m = re.search(r"the server is carpool (\S+) \(protocol (\d+)\)", message)
    assert m, message
    return m.group(1), int(m.group(2))


class OldOrNewClientTest(unittest.TestCase):
    """Fake clients of other protocol versions against this build's server."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="carpool-versions-")
        state = pathlib.Path(cls.tmp.name)
        cls.server = carpool.Server(state, log=str(state / "server.log"), cache_size="8MiB",
                                    workers=1)
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def refusal(self, hello_frame):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(self.server.socket))
            s.sendall(hello_frame)
            version, type_, payload = read_frame(s)
            self.assertEqual(s.recv(1), b"", "the server keeps the connection open")
        self.assertEqual(type_, ERROR)
        code, n = struct.unpack_from("<HI", payload)
        message = payload[6:6 + n].decode()
        self.assertEqual(code, FAILED_PRECONDITION, message)
        self.assertIn(FIX, message)
        package, protocol = server_side(message)
        self.assertEqual(package, carpool.__version__)
        return version, protocol, message

    def test_protocol_5_client_gets_an_error_it_can_read_naming_both_versions(self):
        # Protocol 5's hello: pid, client name; no version. The reply must be in protocol 5, the
        # only version such a client decodes, or it would see only "protocol version N".
        version, protocol, message = self.refusal(frame(5, HELLO, struct.pack("<I", 42)
                                                        + string("old-client")))
        self.assertEqual(version, 5)
        self.assertIn("the client is carpool 0.1.0 (protocol 5)", message)
        self.assertGreater(protocol, 5)

    def test_newer_client_is_named_by_the_version_it_sends(self):
        payload = struct.pack("<I", 42) + string("new-client") + string("9.1.0") + b"later fields"
        version, protocol, message = self.refusal(frame(9, HELLO, payload))
        self.assertEqual(version, 9)
        self.assertIn("the client is carpool 9.1.0 (protocol 9)", message)
        self.assertLess(protocol, 9)

    def test_this_version_still_connects(self):
        self.assertEqual(carpool.server_stats(socket=self.server.socket)["jobs"], [])


class OldServerTest(unittest.TestCase):
    """This build's client against a fake protocol-5 server, which answers any hello of another
    version with an error frame of its own version, as carpool 0.1.0 (protocol 5) did."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="carpool-oldserver-")
        self.path = str(pathlib.Path(self.tmp.name) / "old.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.hellos = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def tearDown(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(5)
        self.tmp.cleanup()

    def serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                version, type_, payload = read_frame(conn)
                self.hellos.append((version, type_, payload))
                said = (f"protocol version {version} is not supported (this side speaks 5); use "
                        "matching client and server builds")
                conn.sendall(frame(5, ERROR, struct.pack("<H", 1) + string(said)))

    def check(self, error):
        message = str(error)
        self.assertIn(f"the server at {self.path} is carpool 0.1.0 (protocol 5)", message)
        m = re.search(r"the client is carpool (\S+) \(protocol (\d+)\)", message)
        self.assertIsNotNone(m, message)
        self.assertEqual(m.group(1), carpool.__version__)
        self.assertGreater(int(m.group(2)), 5)
        self.assertIn(FIX, message)
        self.assertIn("the server said: protocol version", message)  # the old server's own words
        self.assertEqual(error.code_name, "FailedPrecondition")
        # The hello said this client's version after its name (protocol 6 on).
        version, type_, payload = self.hellos[-1]
        self.assertEqual((version, type_), (int(m.group(2)), HELLO))
        self.assertTrue(payload.endswith(string(carpool.__version__)), payload)

    def test_server_stats_names_both_versions(self):
        with self.assertRaises(carpool.CarpoolError) as cm:
            carpool.server_stats(socket=self.path)
        self.check(cm.exception)

    def test_loader_names_both_versions(self):
        with self.assertRaises(carpool.CarpoolError) as cm:
            carpool.Loader("fm", batch_size=8, socket=self.path)
        self.check(cm.exception)


if __name__ == "__main__":
    unittest.main()
