# frozen_string_literal: true
#
# conformance_component.rb [bolt|basic|spout|stateful] - the scripted conformance
# component of spec/CONFORMANCE.md, built on multilang.rb. Its actions are
# keyed on the values of the tuples it receives; `multilang conform` drives it.

require 'json'
require_relative 'multilang'

module Conformance
  def self.ready_line(mode)
    "multilang-conformance ready mode=#{mode} lang=ruby"
  end

  def self.label(value)
    value.is_a?(String) ? value : JSON.generate(value)
  end

  # Mode `bolt`: explicit acks.
  class PlainBolt < Multilang::Bolt
    def prepare(_conf, _context)
      @held = []
      log(Conformance.ready_line('bolt'))
    end

    def process(tup)
      values = tup.values
      case values[0]
      when 'ack'
        ack(tup)
      when 'fail'
        fail(tup)
      when 'echo'
        emit(values, anchors: tup, need_task_ids: false)
        ack(tup)
      when 'emit'
        ids = emit(values[1], stream: values[2], anchors: tup, need_task_ids: true)
        emit(['task_ids', ids], anchors: tup, need_task_ids: false)
        ack(tup)
      when 'emit_unanchored'
        emit(values[1], need_task_ids: false)
        ack(tup)
      when 'emit_direct'
        emit_direct(values[1], values[2], anchors: tup)
        ack(tup)
      when 'emit_many'
        Integer(values[1]).times { |i| emit(['n', i], anchors: tup, need_task_ids: false) }
        ack(tup)
      when 'hold'
        @held << tup
      when 'release'
        emit(values[1], anchors: @held + [tup], need_task_ids: false)
        @held.each { |held| ack(held) }
        @held.clear
        ack(tup)
      when 'log'
        log(values[1], level: values[2])
        ack(tup)
      when 'error'
        report_error(values[1])
        ack(tup)
      when 'metrics'
        metrics(values[1], values[2])
        ack(tup)
      when 'print'
        puts values[1]
        ack(tup)
      when 'exit'
        exit(Integer(values[1]))
      else
        report_error("unknown action: #{Conformance.label(values[0])}")
        fail(tup)
      end
    end

    def process_tick(tup)
      emit(['tick', tup.values[0]], anchors: tup, need_task_ids: false)
      ack(tup)
    end
  end

  # Mode `basic`: auto-anchor, auto-ack, fail on exception.
  class AutoBolt < Multilang::BasicBolt
    def prepare(_conf, _context)
      log(Conformance.ready_line('basic'))
    end

    def process(tup)
      values = tup.values
      case values[0]
      when 'echo' then emit(values, need_task_ids: false)
      when 'raise' then raise RuntimeError, values[1].to_s
      end
    end

    def process_tick(tup)
      emit(['tick', tup.values[0]], need_task_ids: false)
    end
  end

  # Mode `stateful`: a StatefulBolt (spec §9.7) whose tuples edit its state.
  class StateBolt < Multilang::StatefulBolt
    def prepare(_conf, _context)
      log(Conformance.ready_line('stateful'))
    end

    def process(tup)
      values = tup.values
      case values[0]
      when 'put' then state.put(values[1], values[2])
      when 'delete' then state.delete(values[1])
      when 'get' then emit([values[1], state.get(values[1])], anchors: tup, need_task_ids: false)
      else fail(tup)
      end
    end
  end

  # Mode `spout`.
  class ScriptedSpout < Multilang::Spout
    IDS = [0, '1', -2, '-3', 4.5, { 'k' => [5] }, nil].freeze

    def open(_conf, _context)
      @k = 0
      log(Conformance.ready_line('spout'))
      emit(['open'], msg_id: 'open', need_task_ids: false)
    end

    def activate
      emit(['activated'], need_task_ids: false)
    end

    def deactivate
      emit(['deactivated'], need_task_ids: false)
    end

    def next_tuple
      return if @k >= IDS.length

      k = @k
      @k += 1
      ids = emit(['next', k], msg_id: IDS[k], need_task_ids: true)
      emit(['task_ids', ids], need_task_ids: false)
    end

    def ack(msg_id)
      emit(['acked', msg_id], need_task_ids: false)
    end

    def fail(msg_id)
      emit(['failed', msg_id], need_task_ids: false)
    end
  end
end

mode = ARGV[0] || 'bolt'
case mode
when 'bolt' then Conformance::PlainBolt.run
when 'basic' then Conformance::AutoBolt.run
when 'spout' then Conformance::ScriptedSpout.run
when 'stateful' then Conformance::StateBolt.run
else
  warn "usage: ruby conformance_component.rb [bolt|basic|spout|stateful] (got #{mode.inspect})"
  exit 2
end
