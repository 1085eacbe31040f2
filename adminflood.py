import socket, sys, time, urllib.request
port=int(sys.argv[1]); n=int(sys.argv[2]); http=int(sys.argv[3])
ss=[]
for i in range(n):
    try:
        s=socket.create_connection(("127.0.0.1",port), timeout=2)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"%port)
        ss.append(s)
    except Exception as e:
        print("connect fail at", i, e); break
time.sleep(1)
ok=0
for s in ss:
    try:
        s.settimeout(0.2); d=s.recv(1000); ok+= d.startswith(b"HTTP/1.1 200")
    except Exception: pass
print("admin conns answered", ok, "of", len(ss))
for i in range(3):
    try:
        r=urllib.request.urlopen(f"http://127.0.0.1:{http}/x", timeout=3); print("front", r.status)
    except Exception as e: print("front err", e)
time.sleep(2)
for s in ss: s.close()
