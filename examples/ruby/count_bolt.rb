# frozen_string_literal: true
#
# count_bolt.rb - word-count counter (StatefulBolt). Input field 0 is a word;
# count = state[word] + 1 is stored back and [word, count] is emitted,
# anchored to the input. The counts live in the bolt's key-value state: kept
# durable by multilang-bridge's host when it offers the `state` extension
# (spec §9.7), in memory (lost with the process) under Storm's host.

require_relative 'multilang'

class CountBolt < Multilang::StatefulBolt
  def process(tup)
    word = tup.values[0]
    count = state.get(word, 0) + 1
    state.put(word, count)
    emit([word, count])
  end
end

CountBolt.run
