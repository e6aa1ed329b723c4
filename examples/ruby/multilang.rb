# frozen_string_literal: true
#
# multilang.rb - Apache Storm multilang component library for Ruby.
# One file, standard library only (json, monitor, io/wait).
#
# It speaks Storm's standard multilang protocol, so components built on it run
# both under multilang-bridge and under Storm's own ShellBolt / ShellSpout.
# Extensions (the handshake's "extensions" offer, spec §9) are accepted when the host
# offers them. `batch` (§9.5): input tuples may then arrive many per frame, and
# emits that want no task ids, acks and fails are collected into `batch`
# frames. `msgpack` (§9.6): after the JSON handshake and pid reply, every frame
# both ways is a 4-byte big-endian length + one MessagePack object (JSON's data
# model only; a built-in pure-Ruby codec, no gem). Both combine. `state`
# (§9.7), accepted by a StatefulBolt only: the host keeps the bolt's
# key-value state durable (init at start, prepare / commit / rollback at its
# checkpoints); without it (Storm's host) the state is kept in memory. The
# accepted list is `extensions` (default ["batch", "msgpack"], and
# ["batch", "msgpack", "state"] for a StatefulBolt): set
# `self.extensions = ["batch"]` in a subclass body (or
# `MyBolt.run(extensions: ["batch"])`, or `bolt.extensions = [...]` before
# `run`) to decline msgpack, and `[]` to speak the standard protocol only.
#
#   require_relative 'multilang'
#
#   class Upper < Multilang::BasicBolt
#     def process(tup)
#       emit([tup.values[0].to_s.upcase])      # auto-anchored, auto-acked
#     end
#   end
#   Upper.new.run                               # or: Upper.run
#
#   # one-file scripts: the block is the process hook
#   Multilang::BasicBolt.run { |tup, bolt| bolt.emit([tup.values[0]]) }
#
# Hooks (override in a subclass, or pass as keyword procs to the class-level
# `run`, each called with the component as last argument):
#   Bolt / BasicBolt  prepare(conf, context)  process(tup)  process_tick(tup)
#   StatefulBolt      the BasicBolt hooks, and init_state(state)
#                     pre_prepare(txid)  pre_commit(txid)  pre_rollback
#                     (`state` is a KeyValueState: get put delete key? size each)
#   Spout             open(conf, context)  next_tuple  ack(msg_id)  fail(msg_id)
#                     activate  deactivate
# Ruby's own `initialize` is left alone: setup that needs conf/context belongs
# in `prepare` (bolts) or `open` (spouts, where emitting is already legal).
# Inside a Spout `open` is the hook, so use File.open for files; inside a Bolt
# or Spout `fail` is the protocol method, so use `raise` for exceptions.
#
# need_task_ids defaults to FALSE: waiting for one round trip per emit is the
# main throughput killer of multilang. Pass `need_task_ids: true` to get the
# list of task ids back (as pystorm does). Tuples and heartbeats that arrive
# while waiting are queued and handled afterwards, in arrival order.
#
# Errors: an exception escaping BasicBolt#process / #process_tick is sent as an
# `error` frame (message, class, backtrace), the input is failed, and the bolt
# keeps running. Any other exception escaping a hook is sent as an `error`
# frame and the process exits with status 1 (the host restarts it); so does a
# protocol error (a bad frame, and in msgpack mode bin/ext values, a length
# over conf multilang.max.frame.bytes, EOF inside a frame, a state frame out
# of order).
# stdin EOF (the host went away) exits with status 0.
#
# stdout belongs to the protocol. Loading this file installs a guard: protocol
# frames go to a private duplicate of fd 1, fd 1 itself (STDOUT, child
# processes) is pointed at stderr, and `$stdout` becomes an object whose
# writes turn into `log` frames (`puts "x"` -> {"command":"log","msg":"x"}).
# Output printed before the handshake reply is held back until after it.

require 'json'
require 'monitor'
require 'io/wait'

module Multilang
  VERSION = '0.1.0'

  # Log levels of the `log` command.
  TRACE = 0
  DEBUG = 1
  INFO = 2
  WARN = 3
  ERROR = 4
  LEVEL_NAMES = { trace: TRACE, debug: DEBUG, info: INFO, warn: WARN,
                  warning: WARN, error: ERROR }.freeze

  # The host broke the protocol (unparsable frame, bad handshake).
  class ProtocolError < StandardError; end

  # A frame over the size limit (conf multilang.max.frame.bytes, spec §1.3).
  class FrameTooLarge < ProtocolError; end

  # An input tuple. `id` is the host's string, echoed back byte for byte.
  Tuple = Struct.new(:id, :component, :stream, :task, :values) do
    def tick?
      component == '__system' && stream == '__tick'
    end

    def heartbeat?
      stream == '__heartbeat'
    end
  end

  # MessagePack for the `msgpack` extension (spec §9.6), restricted to JSON's
  # data model: map with string keys, array, str (UTF-8), int within 64 bits,
  # float, true/false/nil. Anything else (bin, ext, non-string keys, invalid
  # UTF-8, NaN/Infinity) is a ProtocolError when read and an error when written.
  module MsgPack
    UTF_8 = Encoding::UTF_8
    BINARY = Encoding::BINARY
    UINT64_MAX = (1 << 64) - 1
    INT64_MIN = -(1 << 63)

    # Frame errors are ProtocolErrors; encode errors are these.
    class EncodeError < ArgumentError; end

    module_function

    # One frame: the 4-byte big-endian body length, then the body.
    def frame(obj)
      out = String.new("\0\0\0\0", encoding: BINARY, capacity: 256)
      pack(obj, out)
      set_length(out)
    end

    # Write the body length into the 4 placeholder bytes at the start of out.
    def set_length(out)
      n = out.bytesize - 4
      raise EncodeError, "a frame of #{n} bytes does not fit a 4-byte length prefix" if n > 0xFFFF_FFFF

      out.setbyte(0, n >> 24)
      out.setbyte(1, (n >> 16) & 0xff)
      out.setbyte(2, (n >> 8) & 0xff)
      out.setbyte(3, n & 0xff)
      out
    end

    # Append obj's encoding to the binary string out. Like JSON.generate,
    # non-string map keys and objects of other classes become their #to_s.
    def pack(obj, out)
      case obj
      when String
        # short ASCII (valid UTF-8 by definition) inline: the usual string
        if (n = obj.bytesize) < 32 && obj.ascii_only?
          out << (0xa0 | n) << obj
        else
          pack_str(obj, out)
        end
      when Integer
        obj >= 0 && obj < 0x80 ? out << obj : pack_int(obj, out)
      when Array
        n = obj.size
        n < 16 ? out << (0x90 | n) : array_header(n, out)
        i = 0
        while i < n
          pack(obj[i], out)
          i += 1
        end
      when Hash
        map_header(obj.size, out)
        obj.each do |k, v|
          pack_str(k.is_a?(String) ? k : k.to_s, out)
          pack(v, out)
        end
      when Float
        raise EncodeError, "#{obj} is not allowed in JSON's data model (spec §9.6)" unless obj.finite?

        [0xcb, obj].pack('CG', buffer: out)
      when nil then out << 0xc0
      when false then out << 0xc2
      when true then out << 0xc3
      else pack_str(obj.to_s, out)
      end
      out
    end

    def pack_int(v, out)
      if v >= 0
        if v < 0x80 then out << v
        elsif v < 0x100 then out << 0xcc << v
        elsif v < 0x10000 then [0xcd, v].pack('Cn', buffer: out)
        elsif v < 0x1_0000_0000 then [0xce, v].pack('CN', buffer: out)
        elsif v <= UINT64_MAX then [0xcf, v].pack('CQ>', buffer: out)
        else raise EncodeError, "integer #{v} does not fit in 64 bits (MessagePack uint 64, spec §9.6)"
        end
      elsif v >= -32 then out << (v & 0xff)
      elsif v >= -0x80 then out << 0xd0 << (v & 0xff)
      elsif v >= -0x8000 then [0xd1, v].pack('Cs>', buffer: out)
      elsif v >= -0x8000_0000 then [0xd2, v].pack('Cl>', buffer: out)
      elsif v >= INT64_MIN then [0xd3, v].pack('Cq>', buffer: out)
      else raise EncodeError, "integer #{v} does not fit in 64 bits (MessagePack int 64, spec §9.6)"
      end
    end

    def pack_str(s, out)
      s = s.to_s if s.is_a?(Symbol)
      unless s.encoding == UTF_8 && s.valid_encoding?
        s = utf8(s)
      end
      n = s.bytesize
      if n < 32 then out << (0xa0 | n)
      elsif n < 0x100 then out << 0xd9 << n
      elsif n < 0x10000 then [0xda, n].pack('Cn', buffer: out)
      elsif n <= 0xFFFF_FFFF then [0xdb, n].pack('CN', buffer: out)
      else raise EncodeError, "a string of #{n} bytes is too long for MessagePack"
      end
      # A binary buffer takes non-ASCII UTF-8 only as bytes (#b shares memory).
      out << (s.ascii_only? ? s : s.b)
    end

    # s as valid UTF-8, as JSON.generate takes it: binary strings holding
    # UTF-8 as they are, other encodings converted.
    def utf8(s)
      if s.encoding == UTF_8 || s.encoding == BINARY || s.encoding == Encoding::US_ASCII
        u = s.dup.force_encoding(UTF_8)
        return u if u.valid_encoding?

        raise EncodeError, "string is not valid UTF-8: #{s.byteslice(0, 60).inspect}"
      end
      s.encode(UTF_8)
    rescue EncodingError => e
      raise EncodeError, "string cannot be converted to UTF-8 (#{e.message})"
    end

    def array_header(n, out)
      if n < 16 then out << (0x90 | n)
      elsif n < 0x10000 then [0xdc, n].pack('Cn', buffer: out)
      else [0xdd, n].pack('CN', buffer: out)
      end
    end

    def map_header(n, out)
      if n < 16 then out << (0x80 | n)
      elsif n < 0x10000 then [0xde, n].pack('Cn', buffer: out)
      else [0xdf, n].pack('CN', buffer: out)
      end
    end

    # Decode the frame body buf[start, len]: exactly one map or array.
    def decode_frame(buf, start, len)
      Decoder.new(buf, start, start + len).frame
    end

    # Reads one object from a binary string between two byte positions,
    # without copying the buffer (getbyte / unpack1 with offset:).
    class Decoder
      def initialize(buf, pos, stop)
        @buf = buf
        @pos = pos
        @stop = stop
        @start = pos
      end

      def frame
        enc = @buf.encoding
        @buf.force_encoding(UTF_8) # so byteslice gives UTF-8 strings; restored below
        obj = value
        unless @pos == @stop
          error("#{@stop - @pos} trailing byte(s) after the frame's object (a body holds exactly one object)")
        end
        unless obj.is_a?(Hash) || obj.is_a?(Array)
          error("the frame's object is a #{obj.nil? ? 'nil' : obj.class.name.downcase}, not a map or an array")
        end
        obj
      rescue SystemStackError
        error('objects nested too deeply')
      ensure
        @buf.force_encoding(enc)
      end

      private

      def value
        error('the object is cut short (truncated frame)') if @pos >= @stop
        b = @buf.getbyte(@pos)
        @pos += 1
        return b if b < 0x80                # positive fixint
        return b - 0x100 if b >= 0xe0       # negative fixint
        if b >= 0xa0 && b < 0xc0 # fixstr, inline: the most common value
          pos = @pos
          stop = pos + (b & 0x1f)
          error('the object is cut short (truncated frame)') if stop > @stop
          s = @buf.byteslice(pos, stop - pos)
          @pos = stop
          return s if s.valid_encoding?

          error("a str that is not valid UTF-8: #{s.b.inspect}")
        end
        return map(b & 0x0f) if b < 0x90
        return array(b & 0x0f) if b < 0xa0

        case b
        when 0xc0 then nil
        when 0xc2 then false
        when 0xc3 then true
        when 0xcc then fixed(1, 'C')
        when 0xcd then fixed(2, 'n')
        when 0xce then fixed(4, 'N')
        when 0xcf then fixed(8, 'Q>')
        when 0xd0 then fixed(1, 'c')
        when 0xd1 then fixed(2, 's>')
        when 0xd2 then fixed(4, 'l>')
        when 0xd3 then fixed(8, 'q>')
        when 0xca then float(4, 'g')
        when 0xcb then float(8, 'G')
        when 0xd9 then str(fixed(1, 'C'))
        when 0xda then str(fixed(2, 'n'))
        when 0xdb then str(fixed(4, 'N'))
        when 0xdc then array(fixed(2, 'n'))
        when 0xdd then array(fixed(4, 'N'))
        when 0xde then map(fixed(2, 'n'))
        when 0xdf then map(fixed(4, 'N'))
        when 0xc4, 0xc5, 0xc6
          error(format('bin (type 0x%02x) is not part of the data model (only JSON values, spec §9.6)', b))
        when 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8
          error(format('ext (type 0x%02x) is not part of the data model (only JSON values, spec §9.6)', b))
        else error(format('byte 0x%02x is not a MessagePack type', b))
        end
      end

      def need(n)
        error('the object is cut short (truncated frame)') if @pos + n > @stop
      end

      def fixed(n, fmt)
        need(n)
        v = @buf.unpack1(fmt, offset: @pos)
        @pos += n
        v
      end

      def float(n, fmt)
        v = fixed(n, fmt)
        error("float #{v} is not a JSON number (spec §9.6)") unless v.finite?
        v
      end

      def str(n)
        pos = @pos
        error('the object is cut short (truncated frame)') if pos + n > @stop
        s = @buf.byteslice(pos, n)
        @pos = pos + n
        error("a str that is not valid UTF-8: #{s.b.byteslice(0, 60).inspect}") unless s.valid_encoding?
        s
      end

      # (while loops: no block call per element on the hot path)
      def array(n)
        # Every element takes a byte at least: a count the body cannot hold
        # is an error before anything is allocated.
        error('the object is cut short (truncated frame)') if n > @stop - @pos
        a = []
        i = 0
        while i < n
          a << value
          i += 1
        end
        a
      end

      def map(n)
        error('the object is cut short (truncated frame)') if 2 * n > @stop - @pos
        h = {}
        i = 0
        while i < n
          error('the object is cut short (truncated frame)') if @pos >= @stop
          b = @buf.getbyte(@pos)
          k = if b >= 0xa0 && b < 0xc0 # fixstr, the usual key: inline
                pos = @pos + 1
                stop = pos + (b & 0x1f)
                error('the object is cut short (truncated frame)') if stop > @stop
                @pos = stop
                s = @buf.byteslice(pos, stop - pos)
                error("a str that is not valid UTF-8: #{s.b.inspect}") unless s.valid_encoding?
                s
              elsif b == 0xd9 || b == 0xda || b == 0xdb
                value
              else
                error(format('a map key that is not a str (type byte 0x%02x; keys are strings, spec §9.6)', b))
              end
          h[k] = value
          i += 1
        end
        h
      end

      def error(what)
        body = @buf.byteslice(@start, [@stop - @start, 200].min).b
        raise ProtocolError, "bad msgpack frame from the host: #{what} (frame: #{body.inspect})"
      end
    end
  end

  # Everything that touches the process's stdin/stdout. There is one stdout
  # per process, so this is a module-level singleton.
  module Wire
    FRAME_END = "\nend\n"
    SYNC_FRAME = %({"command":"sync"}\nend\n)
    FLUSH_BYTES = 64 * 1024 # flush early once this much is buffered
    FLUSH_SECS = 0.5        # ... or when the oldest buffered frame is this old
    HALFWAY_FLUSH_MIN = 16  # a chunk of at least this many frames is also flushed halfway
    BATCH_MAX = 1024        # elements per output batch: far below any frame limit
    MAX_FRAME_BYTES = 64 * 1024 * 1024 # spec §1.3 default; conf multilang.max.frame.bytes
    MSGPACK_SYNC = MsgPack.frame({ 'command' => 'sync' }).freeze
    # Pieces of a msgpack output batch (spec §9.5, §9.6).
    MP_BATCH_HEAD = MsgPack.pack({ 'command' => 'batch' }, String.new(encoding: Encoding::BINARY)).byteslice(1..).freeze
    MP_BATCH_KEYS = %w[emits acks fails].map do |k|
      MsgPack.pack(k, String.new(encoding: Encoding::BINARY)).freeze
    end.freeze

    @lock = Monitor.new
    @out = nil      # private dup of fd 1: the protocol channel
    @in = nil
    @buf = []       # encoded frames waiting for the next flush
    @bytes = 0
    @since = nil    # clock time of the oldest buffered frame
    @ready = false  # true once the {"pid": N} reply is out
    @early = []     # frames produced before the pid reply
    @pending = []   # frames read while waiting for task ids
    @logger = nil
    @dead = false
    @reading = false
    @halfway = nil    # frames to read before the halfway flush of a burst
    @batching = false # extension batch accepted (spec §9.5)
    @msgpack = false  # extension msgpack accepted (spec §9.6): frames after the pid reply
    @accepted = []    # every extension the pid reply accepted
    @offered = []     # the host's offer (the handshake's own "extensions", spec §9.1)
    @max_frame = MAX_FRAME_BYTES
    @b_emits = []     # the output batch being filled
    @b_acks = []
    @b_fails = []
    @b_size = 0
    # The output batch being filled in msgpack mode: emits, acks and fails,
    # each already encoded (so a bad value raises in the call that gave it).
    @mb = Array.new(3) { String.new(encoding: Encoding::BINARY) }
    @mb_count = [0, 0, 0]
    @mb_bytes = 0

    class << self
      attr_reader :logger, :batching, :msgpack, :max_frame, :accepted, :offered

      # Idempotent; called when this file is loaded.
      def install
        return if @out

        $stdout.flush if $stdout.respond_to?(:flush)
        @out = STDOUT.dup # a new fd, close-on-exec: children do not inherit it
        @out.binmode
        @out.sync = true # we buffer ourselves and write whole bursts
        STDOUT.reopen(STDERR) # fd 1 (STDOUT, subprocesses) now goes to stderr
        @in = STDIN
        @in.binmode
        @logger = StdoutLogger.new
        $stdout = @logger
        at_exit { final_flush }
      end

      def synchronize(&block)
        @lock.synchronize(&block)
      end

      # Queue one frame (any JSON-able object): JSON text + "end", or a
      # length-prefixed msgpack frame once msgpack is accepted.
      def send_frame(obj)
        @lock.synchronize do
          send_raw(@msgpack ? MsgPack.frame(obj) : JSON.generate(obj) << FRAME_END)
        end
      end

      def send_sync
        send_raw(@msgpack ? MSGPACK_SYNC : SYNC_FRAME)
      end

      def send_raw(data)
        @lock.synchronize do
          @logger&.drain # text printed earlier goes out first
          unless @ready
            @early << data
            return
          end
          close_batch if @b_size.positive? # §9.5: a standard frame keeps the order
          @since ||= now
          @buf << data
          @bytes += data.bytesize
          # @reading: another thread is sending while the main one waits for input.
          flush if @reading || @bytes >= FLUSH_BYTES || now - @since >= FLUSH_SECS
        end
        nil
      end

      # Batch mode (§9.5): add one element to the output batch. An emit is
      # [values, anchors_or_msg_id, stream] with trailing nils left out.
      def batch_emit(elem)
        @lock.synchronize do
          @logger&.drain
          @msgpack ? mp_batch_add(0, elem) : @b_emits << elem
          batch_added
        end
        nil
      end

      def batch_ack(id)
        @lock.synchronize do
          @logger&.drain
          @msgpack ? mp_batch_add(1, id) : @b_acks << id
          batch_added
        end
        nil
      end

      def batch_fail(id)
        @lock.synchronize do
          @logger&.drain
          @msgpack ? mp_batch_add(2, id) : @b_fails << id
          batch_added
        end
        nil
      end

      # Write the open output batch into the buffer as one frame.
      def close_batch
        @lock.synchronize do
          return if @b_size.zero?
          return mp_close_batch if @msgpack

          frame = { 'command' => 'batch' }
          frame['emits'] = @b_emits unless @b_emits.empty?
          frame['acks'] = @b_acks unless @b_acks.empty?
          frame['fails'] = @b_fails unless @b_fails.empty?
          @b_emits = []
          @b_acks = []
          @b_fails = []
          @b_size = 0
          data = JSON.generate(frame) << FRAME_END
          @since ||= now
          @buf << data
          @bytes += data.bytesize
        end
        nil
      end

      def flush
        @lock.synchronize do
          @logger&.drain
          close_batch if @b_size.positive?
          return if @buf.empty?

          data = @buf
          @buf = []
          @bytes = 0
          @since = nil
          return if @dead

          begin
            @out.write(*data)
          rescue Errno::EPIPE, IOError
            # The host closed our stdout: nobody is listening any more.
            @dead = true
            exit(0)
          end
        end
      end

      def final_flush
        flush
      rescue SystemExit, StandardError
        nil
      end

      # The handshake: read {"pidDir","conf","context"}, create the pid file,
      # reply {"pid": N}, with "extensions" for those of `accept` the host
      # offered (spec §9.1, §9.2). Returns [conf, context].
      def handshake(accept = [])
        msg = read_frame
        eof_exit if msg.nil?
        unless msg.is_a?(Hash) && msg.key?('pidDir')
          raise ProtocolError, "expected the handshake frame {\"pidDir\",\"conf\",\"context\"}, got #{snippet(JSON.generate(msg))}"
        end

        pid = Process.pid
        pid_dir = msg['pidDir']
        if pid_dir.is_a?(String) && !pid_dir.empty?
          begin
            File.open(File.join(pid_dir, pid.to_s), 'w') {}
          rescue SystemCallError => e
            warn "multilang: cannot create the pid file in #{pid_dir}: #{e.message}"
          end
        end
        conf = msg['conf'].is_a?(Hash) ? msg['conf'] : {}
        limit = conf['multilang.max.frame.bytes']
        @max_frame = limit if limit.is_a?(Integer) && limit.positive?
        # §9.1: the offer is the handshake's own key, which Storm's host never
        # writes; a conf key (a topology conf Storm passes through) is not one.
        offered = msg['extensions'].is_a?(Array) ? msg['extensions'] : []
        @offered = offered.freeze
        accepted = Array(accept).map(&:to_s).uniq.select { |e| offered.include?(e) }
        reply = { 'pid' => pid }
        reply['extensions'] = accepted unless accepted.empty?
        @lock.synchronize do
          @accepted = accepted.freeze
          @batching = accepted.include?('batch')
          @msgpack = accepted.include?('msgpack')
          @buf.unshift(JSON.generate(reply) << FRAME_END)
          # Frames produced before the reply were encoded as JSON: re-encode.
          @early.each do |data|
            @buf << (@msgpack ? MsgPack.frame(JSON.parse(data.chomp(FRAME_END), max_nesting: false)) : data)
          end
          @early = []
          @ready = true
          flush
        end
        context = msg['context'].is_a?(Hash) ? msg['context'] : {}
        [conf, context]
      end

      # Next frame to handle: queued ones first, then stdin. Exits on EOF.
      def next_message
        return @pending.shift unless @pending.empty?

        msg = read_frame
        eof_exit if msg.nil?
        msg
      end

      # Block until a task-id list (a bare JSON array) arrives; queue anything
      # else that arrives meanwhile, in order.
      def read_task_ids
        loop do
          msg = read_frame
          eof_exit if msg.nil?
          return msg if msg.is_a?(Array)

          @pending << msg
        end
      end

      # Read lines until a line that is exactly "end"; parse the lines before
      # it as one JSON text. Returns nil at EOF.
      LINE_BREAK = /\r\n|\r|\n/n.freeze
      READ_SIZE = 65_536

      # The next line without its line break (\n, \r\n or a lone \r, spec
      # §1.2), or nil at EOF. A \r that ends a chunk ends its line; a \n
      # starting the next chunk is then its tail.
      def read_line
        @rbuf ||= String.new(encoding: Encoding::BINARY)
        @rpos ||= 0
        loop do
          # Binary string: character offsets are byte offsets.
          i = @rbuf.index(LINE_BREAK, @rpos)
          if i
            len = @rbuf.getbyte(i) == 13 && @rbuf.getbyte(i + 1) == 10 ? 2 : 1
            line = @rbuf.byteslice(@rpos, i - @rpos)
            @rpos = i + len
            @skip_lf = len == 1 && @rbuf.getbyte(i) == 13 && @rpos == @rbuf.bytesize
            return line
          end
          @rbuf = @rbuf.byteslice(@rpos..) if @rpos.positive?
          @rpos = 0
          # Spec §1.3: never buffer more than the limit waiting for a line break.
          raise FrameTooLarge, too_large(@rbuf.bytesize, 'unterminated input of') if @rbuf.bytesize > @max_frame
          chunk = read_chunk
          if chunk.nil?
            return nil if @rbuf.empty?

            line = @rbuf
            @rbuf = String.new(encoding: Encoding::BINARY)
            @rpos = 0
            return line
          end
          @rbuf << chunk
        end
      end

      # The next chunk of stdin (binary), or nil at EOF. Flushes first if
      # the read may block.
      def read_chunk
        flush_before_read
        @reading = true
        chunk = begin
          @in.readpartial(READ_SIZE)
        rescue EOFError
          nil
        end
        @reading = false
        return nil if chunk.nil?

        chunk = chunk.b
        chunk = chunk.byteslice(1..) if @skip_lf && chunk.start_with?("\n")
        @skip_lf = false
        count_burst(chunk) unless @msgpack
        chunk
      end

      # A chunk of many frames is a burst. Its first half is answered
      # (flushed) before the second half is handled: a host keeps at most
      # topology.shellbolt.max.pending tuples unacked (spec §5.3), and with
      # the first half's acks it sends more while we work, instead of host
      # and component taking turns. One more write per burst.
      def count_burst(chunk)
        n = 0
        i = 0
        while (i = chunk.index(FRAME_END, i))
          n += 1
          i += FRAME_END.bytesize
        end
        @halfway = n >= HALFWAY_FLUSH_MIN ? n / 2 + 1 : nil # flush on reading the frame after the first half
      end

      # msgpack mode (spec §9.6): a 4-byte big-endian length N, then N bytes
      # holding one map or array. nil at EOF on a frame boundary.
      def read_msgpack_frame
        @rbuf ||= String.new(encoding: Encoding::BINARY)
        @rpos ||= 0
        loop do
          avail = @rbuf.bytesize - @rpos
          if avail >= 4
            n = @rbuf.unpack1('N', offset: @rpos)
            check_length(n) # at once, before the body is read
            if avail >= n + 4
              start = @rpos + 4
              @rpos = start + n
              return MsgPack.decode_frame(@rbuf, start, n)
            end
          end
          if @rpos.positive? # drop what was consumed, keep the partial frame
            @rbuf = @rbuf.byteslice(@rpos..)
            @rpos = 0
          end
          chunk = read_chunk
          if chunk.nil?
            return nil if @rbuf.empty?

            want = avail >= 4 ? "#{n + 4}-byte frame" : '4-byte length prefix'
            raise ProtocolError, "stream ended in the middle of a frame (#{@rbuf.bytesize} bytes of a #{want}: " \
                                 "#{snippet(@rbuf)})"
          end
          @rbuf << chunk
        end
      end

      def too_large(n, what)
        "#{what} #{n} bytes exceeds the #{@max_frame}-byte limit (multilang.max.frame.bytes)"
      end

      def check_length(n)
        if n.zero?
          raise ProtocolError, 'bad msgpack frame from the host: length 0 (a body holds exactly one object, spec §9.6)'
        end
        return if n <= @max_frame

        prefix = @rbuf.byteslice(@rpos, 4)
        hint = prefix.match?(/\A[\[{\s]/n) ? ' (a JSON frame after msgpack was accepted?)' : ''
        raise FrameTooLarge, "frame of #{n} bytes exceeds the #{@max_frame}-byte limit (multilang.max.frame.bytes)" \
                             "#{hint}; length prefix #{prefix.inspect}"
      end

      def read_frame
        return read_msgpack_frame if @msgpack

        first = nil
        more = nil
        size = -1 # bytes of the frame's text so far: its lines and the breaks between them
        loop do
          line = read_line
          break if line.nil?

          if line == 'end'
            text = more ? more.join("\n") : first
            first = more = nil
            size = -1
            next if text.nil? || text.strip.empty? # blank lines between frames

            if @halfway && (@halfway -= 1).zero? # see count_burst
              @halfway = nil
              flush
            end
            return parse(text)
          end
          size += line.bytesize + 1
          raise FrameTooLarge, too_large(size, 'a frame of at least') if size > @max_frame # spec §1.3
          if first.nil?
            first = line
          elsif more
            more << line
          else
            more = [first, line]
          end
        end
        nil
      end

      def parse(text)
        text.force_encoding(Encoding::UTF_8)
        JSON.parse(text, max_nesting: false)
      rescue JSON::ParserError => e
        raise ProtocolError, "unparsable frame from the host (#{e.message.lines.first&.strip}): #{snippet(text)}"
      end

      # Coalesce writes: flush only when the next read may block (nothing
      # readable yet), or when buffered frames are getting old.
      def flush_before_read
        return if @buf.empty? && @b_size.zero? && !@logger&.pending?

        readable = begin
          @in.nread
        rescue StandardError
          0
        end
        flush if readable.zero? || @since.nil? || now - @since >= FLUSH_SECS
      end

      def eof_exit
        final_flush
        exit(0)
      end

      private

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # After adding a batch element (lock held): close the batch at
      # BATCH_MAX elements; flush as send_raw would (another thread sending
      # while we wait for input, or output getting old).
      def batch_added
        @b_size += 1
        @since ||= now
        close_batch if @b_size >= BATCH_MAX
        flush if @reading || @bytes >= FLUSH_BYTES || now - @since >= FLUSH_SECS
      end

      # msgpack mode: encode value onto the batch list i (0 emits, 1 acks,
      # 2 fails). On an encode error nothing is added. A batch that would
      # outgrow the frame limit is closed first (spec §9.5).
      def mp_batch_add(i, value)
        buf = @mb[i]
        mark = buf.bytesize
        begin
          MsgPack.pack(value, buf)
        rescue Exception # rubocop:disable Lint/RescueException -- undo, then re-raise
          buf.slice!(mark..)
          raise
        end
        size = buf.bytesize - mark
        if @b_size.positive? && @mb_bytes + size > @max_frame - 64
          piece = buf.byteslice(mark..)
          buf.slice!(mark..)
          mp_close_batch
          @mb[i] << piece
        end
        @mb_count[i] += 1
        @mb_bytes += size
      end

      # Write the open msgpack batch into the output buffer (lock held).
      def mp_close_batch
        data = String.new("\0\0\0\0", encoding: Encoding::BINARY, capacity: @mb_bytes + 64)
        MsgPack.map_header(1 + @mb_count.count(&:positive?), data)
        data << MP_BATCH_HEAD
        3.times do |i|
          next if @mb_count[i].zero?

          data << MP_BATCH_KEYS[i]
          MsgPack.array_header(@mb_count[i], data)
          data << @mb[i]
          @mb[i] = String.new(encoding: Encoding::BINARY)
          @mb_count[i] = 0
        end
        @mb_bytes = 0
        @b_size = 0
        MsgPack.set_length(data)
        @since ||= now
        @buf << data
        @bytes += data.bytesize
        nil
      end

      def snippet(text)
        s = text.to_s
        s.bytesize > 200 ? "#{s.byteslice(0, 200).scrub.inspect}..." : s.scrub.inspect
      end
    end
  end

  # Replaces $stdout: whatever user code prints becomes `log` frames, one per
  # completed write ending in a newline (that newline removed). Unterminated
  # text is sent before the next protocol frame or read.
  class StdoutLogger
    def initialize
      @pending = String.new(encoding: Encoding::BINARY)
    end

    def write(*args)
      n = 0
      Wire.synchronize do
        args.each do |a|
          s = a.to_s
          n += s.bytesize
          @pending << s.b
        end
        drain if @pending.end_with?("\n")
      end
      n
    end
    alias syswrite write
    alias write_nonblock write

    def <<(obj)
      write(obj)
      self
    end

    def print(*args)
      args = [$_] if args.empty?
      write(*args.map { |a| a.nil? ? '' : a })
      write($\) if $\
      nil
    end

    def puts(*args)
      if args.empty?
        write("\n")
        return nil
      end

      args.each do |a|
        if a.is_a?(Array)
          a.flatten.each { |e| puts(e) }
          next
        end
        s = a.nil? ? '' : a.to_s
        s.end_with?("\n") ? write(s) : write(s, "\n")
      end
      nil
    end

    def printf(fmt, *args)
      write(format(fmt, *args))
      nil
    end

    def putc(ch)
      write(ch.is_a?(Integer) ? (ch & 0xff).chr : ch.to_s[0])
      ch
    end

    def pending?
      !@pending.empty?
    end

    # Send unterminated text now. Called by the wire before any frame.
    def drain
      return if @pending.empty?

      msg = @pending.dup.force_encoding(Encoding::UTF_8).scrub
      @pending.clear
      Wire.send_frame({ 'command' => 'log', 'msg' => msg.chomp })
    end

    def flush
      Wire.flush
      self
    end

    def fsync
      flush
      0
    end

    def sync
      true
    end

    def sync=(value); end

    def tty?
      false
    end
    alias isatty tty?

    def fileno
      nil
    end

    def close; end

    def closed?
      false
    end

    def external_encoding
      Encoding::UTF_8
    end

    def internal_encoding
      nil
    end

    def set_encoding(*)
      self
    end

    def binmode
      self
    end
  end

  # Helpers shared by bolts and spouts.
  class Component
    attr_reader :conf, :context

    # Extensions accepted when the host offers them (spec §9). A subclass
    # overrides it with `self.extensions = ['batch']` (no msgpack) or
    # `self.extensions = []` (standard protocol only).
    DEFAULT_EXTENSIONS = %w[batch msgpack].freeze

    class << self
      attr_writer :extensions

      def extensions
        return @extensions unless @extensions.nil?

        superclass.respond_to?(:extensions) ? superclass.extensions : DEFAULT_EXTENSIONS
      end
    end

    # Per instance; defaults to the class setting.
    attr_writer :extensions

    def extensions
      @extensions.nil? ? self.class.extensions : @extensions
    end

    # Class-level runner: `MyBolt.run`, or a block for one-file scripts.
    # `extensions:` overrides the accepted extensions ([] = standard only).
    def self.run(extensions: nil, **hooks, &block)
      comp = new
      comp.extensions = extensions unless extensions.nil?
      comp.send(:install_hooks, block, hooks) if block || !hooks.empty?
      comp.run
    end

    def run
      Wire.install
      begin
        @conf, @context = Wire.handshake(accepted_extensions)
        setup
        main_loop
      rescue SystemExit, SignalException
        raise
      rescue ProtocolError => e
        crash(e, 'protocol error')
      rescue Exception => e # rubocop:disable Lint/RescueException
        crash(e, "uncaught exception in #{self.class}")
      ensure
        Wire.final_flush
      end
    end

    # What the handshake accepts when offered: `extensions` without `state`
    # (only a StatefulBolt keeps a state, spec §9.7).
    def accepted_extensions
      Array(extensions).map(&:to_s) - ['state']
    end

    def task_id
      @context && @context['taskid']
    end

    def component_id
      @context && @context['componentid']
    end

    # level: 0..4 (TRACE DEBUG INFO WARN ERROR) or :trace/:debug/:info/:warn/:error.
    def log(msg, level: INFO)
      level = LEVEL_NAMES.fetch(level.to_s.downcase.to_sym, INFO) if level.is_a?(Symbol) || level.is_a?(String)
      Wire.send_frame({ 'command' => 'log', 'msg' => Multilang.text(msg), 'level' => level.nil? ? INFO : level })
    end

    def report_error(msg)
      Wire.send_frame({ 'command' => 'error', 'msg' => Multilang.text(msg) })
    end

    def metrics(name, params)
      Wire.send_frame({ 'command' => 'metrics', 'name' => name.to_s, 'params' => params })
    end

    # Write buffered frames now (normally done before every blocking read).
    def flush
      Wire.flush
    end

    private

    def crash(err, what)
      text = "#{what}: #{Multilang.describe_exception(err)}"
      begin
        report_error(text)
        Wire.flush
      rescue StandardError, SystemExit
        nil
      end
      warn "multilang: #{text}"
      exit(1)
    end

    def check_values(values)
      return values if values.is_a?(Array)

      raise TypeError, "tuple values must be an Array, got #{values.class}"
    end

    def stream_name(stream)
      return nil if stream.nil?

      s = stream.to_s
      s == 'default' ? nil : s
    end

    # Emit frame; returns the task ids if asked for (non-direct emits only).
    def send_emit(frame, need_task_ids, direct)
      frame['need_task_ids'] = need_task_ids && !direct ? true : false
      Wire.send_frame(frame)
      return nil if direct || !need_task_ids

      Wire.flush
      Wire.read_task_ids
    end

    # The host's next frame that is an object: one that is not (a task-id list
    # no emit waits for) is reported on stderr and skipped.
    def next_command
      loop do
        msg = Wire.next_message
        return msg if msg.is_a?(Hash)

        warn "multilang: ignoring an unexpected frame (no emit is waiting for task ids): #{JSON.generate(msg)[0, 200]}"
      end
    end

    def define_hook(name, callable)
      define_singleton_method(name) { |*args| callable.call(*args, self) }
    end

    # `fail` shadows Kernel#fail inside components; keep `fail SomeError, "x"`
    # and `fail some_exception` raising.
    def exception_like?(arg, rest)
      !rest.empty? || arg.is_a?(Exception) || (arg.is_a?(Class) && arg <= Exception)
    end
  end

  # A bolt with explicit acks: user code calls ack/fail for every input.
  class Bolt < Component
    # Hooks ------------------------------------------------------------------
    def prepare(conf, context); end

    def process(tup)
      raise NotImplementedError, "#{self.class} must define process(tup)"
    end

    # Tick tuples (component "__system", stream "__tick") come here only.
    def process_tick(tup)
      ack(tup)
    end

    # Protocol ----------------------------------------------------------------
    # anchors: a Tuple, an id string, or an Array of them (nil/[] = unanchored).
    def emit(values, stream: nil, anchors: nil, need_task_ids: false)
      if Wire.batching && !need_task_ids
        # §9.5: [values, anchors, stream], trailing nils and [] left out.
        ids = anchor_ids(anchors)
        s = stream_name(stream)
        values = check_values(values)
        elem = if s then [values, ids.empty? ? nil : ids, s]
               elsif ids.empty? then [values]
               else [values, ids]
               end
        return Wire.batch_emit(elem)
      end
      frame = { 'command' => 'emit', 'anchors' => anchor_ids(anchors) }
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['tuple'] = check_values(values)
      send_emit(frame, need_task_ids, false)
    end

    def emit_direct(task, values, stream: nil, anchors: nil)
      frame = { 'command' => 'emit', 'anchors' => anchor_ids(anchors) }
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['task'] = Integer(task)
      frame['tuple'] = check_values(values)
      send_emit(frame, false, true)
    end

    def ack(tup)
      return Wire.batch_ack(id_of(tup)) if Wire.batching

      Wire.send_frame({ 'command' => 'ack', 'id' => id_of(tup) })
    end

    def fail(tup, *rest)
      return raise(tup, *rest) if exception_like?(tup, rest)
      return Wire.batch_fail(id_of(tup)) if Wire.batching

      Wire.send_frame({ 'command' => 'fail', 'id' => id_of(tup) })
    end

    private

    def setup
      prepare(@conf, @context)
    end

    def main_loop
      loop do
        msg = next_command
        if msg['stream'] == '__heartbeat'
          Wire.send_sync # never acked, never shown to user code
        elsif (batch = msg['tuples'])
          raise ProtocolError, 'a tuple batch without the batch extension (spec §9.5)' unless Wire.batching

          # §9.5: [id, comp, stream, task, values] each, in delivery order.
          batch.each do |t|
            if t[2] == '__heartbeat'
              Wire.send_sync
            else
              handle_tuple(Tuple.new(t[0], t[1], t[2], t[3], t[4] || []))
            end
          end
        elsif msg['command'] == 'state'
          handle_state(msg)
        else
          handle_tuple(Tuple.new(msg['id'], msg['comp'], msg['stream'], msg['task'], msg['tuple'] || []))
        end
      end
    end

    def handle_tuple(tup)
      tup.tick? ? process_tick(tup) : process(tup)
    end

    # A state frame (spec §9.7); a StatefulBolt that accepted `state` handles it.
    def handle_state(msg)
      raise ProtocolError, "state.negotiated: a state frame on a connection that did not accept the state " \
                           "extension (spec §9.7): #{Multilang.frame_text(msg)}"
    end

    def default_anchors
      []
    end

    def anchor_ids(anchors)
      return default_anchors if anchors.nil?

      list = anchors.is_a?(Array) ? anchors : [anchors]
      list.map { |a| id_of(a) }
    end

    def id_of(tup)
      tup.is_a?(Tuple) ? tup.id : tup
    end

    def install_hooks(block, hooks)
      define_hook(:process, block) if block
      hooks.each do |name, callable|
        case name.to_sym
        when :prepare then define_hook(:prepare, callable)
        when :process then define_hook(:process, callable)
        when :tick, :process_tick then define_hook(:process_tick, callable)
        else raise ArgumentError, "unknown bolt hook #{name.inspect} (prepare, process, tick)"
        end
      end
    end
  end

  # Auto-anchoring, auto-acking bolt. Emits without `anchors:` are anchored to
  # the current input; the input is acked after process returns (unless user
  # code acked or failed it); an exception sends an `error` frame, fails the
  # input and the bolt keeps running.
  class BasicBolt < Bolt
    def ack(tup)
      @finished = true if @current && id_of(tup) == @current.id
      super
    end

    def fail(tup, *rest)
      return raise(tup, *rest) if exception_like?(tup, rest)

      @finished = true if @current && id_of(tup) == @current.id
      super
    end

    private

    def handle_tuple(tup)
      @current = tup
      @finished = false
      begin
        super
      rescue ProtocolError
        raise
      rescue StandardError, ScriptError, SystemStackError => e
        report_error(Multilang.describe_exception(e))
        fail(tup) unless @finished
        return
      ensure
        @current = nil
      end
      ack(tup) unless @finished
    end

    def default_anchors
      @current ? [@current.id] : []
    end
  end

  # The key-value state of a StatefulBolt (spec §9.7; Storm's KeyValueState).
  # Keys are Strings; values are JSON values: Hash with String keys, Array,
  # String, Integer, finite Float, true, false, nil (anything else is a
  # TypeError from `put`, naming the key). `put` stores a deep frozen copy,
  # so a value from `get` is frozen: to change one, put a changed copy
  # (`state.put(k, state.get(k, []) + [x])`), as a change made in place would
  # be neither checkpointed nor rolled back.
  class KeyValueState
    include Enumerable

    ABSENT = Object.new.freeze # an undo entry for a key that did not exist
    private_constant :ABSENT

    def initialize
      @map = {}
      @dirty = {}    # keys put or deleted since the last init, prepared or rollback (in order)
      @undo = {}     # key => its value as of the last init or commit (or ABSENT), for keys changed since
      @prepared = {} # key => the value (or ABSENT) it was prepared with, since the last commit or rollback
    end

    def get(key, default = nil)
      @map.fetch(check_key(key), default)
    end

    def put(key, value)
      check_key(key)
      copy = KeyValueState.json_value(value, key) # raises before anything changes
      changing(key)
      @map[key] = copy
      nil
    end

    # Removes the key; its value, or nil if there was none.
    def delete(key)
      check_key(key)
      changing(key)
      @map.delete(key)
    end

    def key?(key)
      @map.key?(check_key(key))
    end
    alias include? key?

    def size
      @map.size
    end
    alias length size

    def empty?
      @map.empty?
    end

    # Yields each key and value (an Enumerator without a block).
    def each(&block)
      return enum_for(:each) { @map.size } unless block

      @map.each(&block)
      self
    end

    def inspect
      "#<#{self.class} #{@map.inspect}>"
    end

    # A deep frozen copy of a JSON value; a TypeError naming the key otherwise.
    def self.json_value(value, key)
      case value
      when String then value.frozen? ? value : value.dup.freeze
      when Integer, true, false, nil then value
      when Float
        return value if value.finite?

        raise TypeError, "state value for key #{key.inspect}: #{value} is not a JSON number"
      when Array then value.map { |v| json_value(v, key) }.freeze
      when Hash
        copy = {}
        value.each do |k, v|
          unless k.is_a?(String)
            raise TypeError, "state value for key #{key.inspect}: the Hash key #{k.inspect} (#{k.class}) " \
                             'is not a String (JSON object keys are strings)'
          end
          copy[k] = json_value(v, key)
        end
        copy.freeze
      else raise TypeError, "state value for key #{key.inspect}: #{value.class} is not a JSON value"
      end
    end

    def self.deep_freeze(value)
      case value
      when Array then value.each { |v| deep_freeze(v) }
      when Hash then value.each_value { |v| deep_freeze(v) }
      end
      value.freeze
    end

    # For StatefulBolt ---------------------------------------------------------
    # init: the state becomes `hash` (as read from the host, adopted).
    def _load(hash)
      hash.each_value { |v| KeyValueState.deep_freeze(v) }
      @map = hash
      @dirty = {}
      @undo = {}
      @prepared = {}
    end

    # prepare: the changes since the last init, prepared or rollback, as
    # [put (key => value), delete (keys)]; they are forgotten.
    def _take_changes
      put = {}
      delete = []
      @dirty.each_key do |k|
        if @map.key?(k)
          put[k] = @prepared[k] = @map[k]
        else
          delete << k
          @prepared[k] = ABSENT
        end
      end
      @dirty = {}
      [put, delete]
    end

    # commit: what was prepared is durable. A key changed since the prepare
    # is restored by a rollback to its prepared value from now on.
    def _commit
      undo = {}
      @dirty.each_key { |k| undo[k] = @prepared.key?(k) ? @prepared[k] : @undo[k] }
      @undo = undo
      @prepared = {}
    end

    # rollback: back to the state as of the last init or commit.
    def _rollback
      @undo.each { |k, v| v.equal?(ABSENT) ? @map.delete(k) : @map[k] = v }
      @dirty = {}
      @undo = {}
      @prepared = {}
    end

    private

    def check_key(key)
      return key if key.is_a?(String)

      raise TypeError, "state keys must be Strings, got #{key.inspect} (#{key.class})"
    end

    def changing(key)
      @undo[key] = @map.fetch(key, ABSENT) unless @undo.key?(key)
      @dirty[key] = true
    end
  end

  # A BasicBolt with a key-value state (spec §9.7; Storm's IStatefulBolt).
  # Under a host that offers the `state` extension (multilang-bridge's) the
  # host keeps the state durable: it gives it back at every process start,
  # collects the changes at each checkpoint and commits or rolls them back.
  # Under a host that does not (Storm's ShellBolt) the state lives in memory,
  # starting empty, as with Storm's default InMemoryKeyValueStateProvider.
  #
  #   class Counter < Multilang::StatefulBolt
  #     def process(tup)
  #       n = state.get(tup.values[0], 0) + 1
  #       state.put(tup.values[0], n)
  #       emit([tup.values[0], n])              # auto-anchored, auto-acked
  #     end
  #   end
  #
  # Hooks (no-ops by default; keyword procs to `run` too): init_state(state),
  # once per process start, after prepare and the host's whole init and before
  # the first tuple; pre_prepare(txid), pre_commit(txid), pre_rollback. A hook
  # that raises stops the process (status 1): the host rolls back and restarts.
  # `extensions` defaults to ["batch", "msgpack", "state"]; a list without
  # "state" keeps the state in memory only.
  class StatefulBolt < BasicBolt
    self.extensions = (DEFAULT_EXTENSIONS + ['state']).freeze
    STATE_ACTIONS = %w[init prepare commit rollback].freeze
    CHUNK_KEYS = 1000        # keys per prepared frame at most
    CHUNK_BYTES = 1 << 20    # ... and about this many bytes

    def state
      @state ||= KeyValueState.new
    end

    def init_state(state); end

    def pre_prepare(txid); end

    def pre_commit(txid); end

    def pre_rollback; end

    def accepted_extensions
      Array(extensions).map(&:to_s)
    end

    private

    def setup
      super
      @last_prepared = nil
      @stateful = Wire.accepted.include?('state')
      if @stateful
        read_init
      elsif Wire.offered.include?('state')
        warn "multilang: #{self.class} declined the offered state extension (extensions #{extensions.inspect}); " \
             'its state is kept in memory only'
      end
      init_state(state)
    end

    # The host's init (spec §9.7): its first frame, maybe in chunks.
    def read_init
      merged = nil
      txid = nil
      loop do
        msg = Wire.next_message
        unless msg.is_a?(Hash) && msg['command'] == 'state' && msg['action'] == 'init'
          raise ProtocolError, "state.order: #{frame_kind(msg)} before the whole state init (spec §9.7): " \
                               "#{Multilang.frame_text(msg)}"
        end
        check_state_frame(msg)
        if merged.nil?
          txid = msg['txid']
          merged = msg['state']
        else
          unless msg['txid'] == txid
            raise ProtocolError, "state.invalid: init chunks with txids #{txid.inspect} and #{msg['txid'].inspect} " \
                                 "(spec §9.7): #{Multilang.frame_text(msg)}"
          end
          msg['state'].each do |k, v|
            if merged.key?(k)
              raise ProtocolError, "state.invalid: key #{k.inspect} in two init chunks (spec §9.7): " \
                                   "#{Multilang.frame_text(msg)}"
            end
            merged[k] = v
          end
        end
        break unless msg['more']
      end
      state._load(merged)
    end

    def frame_kind(msg)
      return 'a task-id list' unless msg.is_a?(Hash)
      return 'a heartbeat' if msg['stream'] == '__heartbeat'
      return 'a tuple batch' if msg.key?('tuples')
      return "a state frame (action #{msg['action'].inspect})" if msg['command'] == 'state'

      'a tuple'
    end

    def handle_state(msg)
      super unless @stateful
      check_state_frame(msg)
      txid = msg['txid']
      case msg['action']
      when 'init'
        raise ProtocolError, "state.order: a second init (spec §9.7): #{Multilang.frame_text(msg)}"
      when 'prepare'
        pre_prepare(txid)
        send_prepared(txid, *state._take_changes)
        @last_prepared = txid
      when 'commit'
        if @last_prepared.nil? || txid != @last_prepared
          raise ProtocolError, "state.order: commit #{txid} does not name the last answered prepare " \
                               "(#{@last_prepared.nil? ? 'none' : @last_prepared}) (spec §9.7)"
        end
        pre_commit(txid)
        state._commit
        @last_prepared = nil
      when 'rollback'
        pre_rollback
        state._rollback
        @last_prepared = nil
      end
    end

    def check_state_frame(msg)
      action = msg['action']
      txid = msg['txid']
      what = if !STATE_ACTIONS.include?(action)
               "unknown action #{action.inspect}"
             elsif !((txid.is_a?(Integer) && txid >= 1) || (txid.nil? && %w[init rollback].include?(action)))
               "txid #{txid.inspect} (an integer >= 1#{%w[init rollback].include?(action) ? ', or null' : ''})"
             elsif action == 'init' && !msg['state'].is_a?(Hash)
               'state is not an object'
             elsif msg.key?('more') && msg['more'] != true && msg['more'] != false
               'more is not a boolean'
             end
      raise ProtocolError, "state.invalid: #{what} (spec §9.7): #{Multilang.frame_text(msg)}" if what
    end

    # The `prepared` answer, in chunks of at most CHUNK_KEYS keys and about
    # CHUNK_BYTES bytes ("more": true on all but the last).
    def send_prepared(txid, put, delete)
      limit = [CHUNK_BYTES, Wire.max_frame / 2].min
      chunk_put = {}
      chunk_delete = []
      n = 0
      bytes = 0
      add = lambda do |key, size|
        if size > Wire.max_frame - 200
          raise ArgumentError, "state value for key #{key.inspect} takes #{size} bytes, more than a frame may hold " \
                               "(#{Wire.max_frame} bytes, multilang.max.frame.bytes)"
        end
        if n.positive? && (n >= CHUNK_KEYS || bytes + size > limit)
          send_prepared_chunk(txid, chunk_put, chunk_delete, true)
          chunk_put = {}
          chunk_delete = []
          n = 0
          bytes = 0
        end
        n += 1
        bytes += size
      end
      put.each do |k, v|
        add.call(k, k.bytesize + json_size(v) + 4)
        chunk_put[k] = v
      end
      delete.each do |k|
        add.call(k, k.bytesize + 3)
        chunk_delete << k
      end
      send_prepared_chunk(txid, chunk_put, chunk_delete, false)
    end

    def send_prepared_chunk(txid, put, delete, more)
      frame = { 'command' => 'state', 'action' => 'prepared', 'txid' => txid, 'put' => put, 'delete' => delete }
      frame['more'] = true if more
      Wire.send_frame(frame) # a standard frame: closes an open output batch first
    end

    def json_size(value)
      case value
      when Integer, true, false, nil then 20
      else JSON.generate(value).bytesize
      end
    end

    def install_hooks(block, hooks)
      state_hooks = %i[init_state pre_prepare pre_commit pre_rollback]
      mine, rest = hooks.partition { |name, _| state_hooks.include?(name.to_sym) }
      mine.each { |name, callable| define_hook(name.to_sym, callable) }
      super(block, rest.to_h)
    end
  end

  # A spout. Every command from the host gets exactly one sync, after the
  # hook returns.
  class Spout < Component
    # Hooks ------------------------------------------------------------------
    def open(conf, context); end # emitting here is legal

    def next_tuple; end

    def ack(msg_id); end

    def fail(msg_id, *rest)
      raise(msg_id, *rest) if exception_like?(msg_id, rest)
    end

    def activate; end

    def deactivate; end

    # Protocol ----------------------------------------------------------------
    # msg_id nil = unreliable; any other JSON value (0 included) is reliable and
    # comes back to ack/fail with its JSON type preserved.
    def emit(values, stream: nil, msg_id: nil, need_task_ids: false)
      if Wire.batching && !need_task_ids
        # §9.5: [values, msg_id, stream], trailing nils left out.
        s = stream_name(stream)
        values = check_values(values)
        elem = if s then [values, msg_id, s]
               elsif msg_id.nil? then [values]
               else [values, msg_id]
               end
        return Wire.batch_emit(elem)
      end
      frame = { 'command' => 'emit' }
      frame['id'] = msg_id unless msg_id.nil?
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['tuple'] = check_values(values)
      send_emit(frame, need_task_ids, false)
    end

    def emit_direct(task, values, stream: nil, msg_id: nil)
      frame = { 'command' => 'emit' }
      frame['id'] = msg_id unless msg_id.nil?
      s = stream_name(stream)
      frame['stream'] = s if s
      frame['task'] = Integer(task)
      frame['tuple'] = check_values(values)
      send_emit(frame, false, true)
    end

    private

    def setup
      open(@conf, @context)
    end

    def main_loop
      loop do
        msg = next_command
        command = msg['command']
        case command
        when 'next' then next_tuple
        when 'ack' then ack(msg['id'])
        when 'fail' then fail(msg['id'])
        when 'activate' then activate
        when 'deactivate' then deactivate
        else log("multilang: unknown spout command #{JSON.generate(command)}, answering sync", level: WARN)
        end
        Wire.send_sync
      end
    end

    def install_hooks(block, hooks)
      define_hook(:next_tuple, block) if block
      hooks.each do |name, callable|
        case name.to_sym
        when :open, :ack, :fail, :activate, :deactivate, :next_tuple
          define_hook(name.to_sym, callable)
        when :next then define_hook(:next_tuple, callable)
        else raise ArgumentError, "unknown spout hook #{name.inspect} (open, next_tuple, ack, fail, activate, deactivate)"
        end
      end
    end
  end

  def self.text(msg)
    s = msg.is_a?(String) ? msg : msg.to_s
    s.valid_encoding? && s.encoding == Encoding::UTF_8 ? s : s.dup.force_encoding(Encoding::UTF_8).scrub
  end

  # A frame from the host as shown in an error: its JSON, at most 200 bytes.
  def self.frame_text(msg)
    text = JSON.generate(msg)
    text.bytesize > 200 ? "#{text.byteslice(0, 200).scrub}..." : text
  rescue StandardError
    msg.inspect[0, 200]
  end

  def self.describe_exception(err)
    text = +"#{err.message} (#{err.class})"
    (err.backtrace || []).each { |line| text << "\n\tfrom " << line }
    text
  end

  Wire.install
end
